//! The node lifecycle controller's decisions over cached state, no API call: a Node's health from
//! its Ready condition's heartbeat and its Lease (`tryUpdateNodeHealth`), the conditions to write
//! when it went quiet, the condition-derived NoSchedule taints (`doNoScheduleTaintingPass`), what
//! the NoExecute pass does (`processTaintBaseEviction`, `doNoExecuteTaintingPass`), the zones'
//! states and eviction rates (`ComputeZoneState`, `handleDisruption`), the beta OS and arch labels
//! (`reconcileNodeLabels`) and the Pod Ready patch (`MarkPodsNotReady`).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::helpers::taints::{node_taints, TAINT_EFFECT_NO_EXECUTE, TAINT_EFFECT_NO_SCHEDULE};

pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
pub const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
pub const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
pub use crate::helpers::taints::TAINT_NODE_UNSCHEDULABLE as TAINT_UNSCHEDULABLE;

/// The label taking a Node out of its zone's health count (`labelNodeDisruptionExclusion`).
pub const LABEL_EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";

/// `nodeConditionToTaintKeyStatusMap`: (condition, status, taint key).
const CONDITION_TAINTS: [(&str, &str, &str); 6] = [
    ("Ready", "False", TAINT_NOT_READY),
    ("Ready", "Unknown", TAINT_UNREACHABLE),
    ("MemoryPressure", "True", TAINT_MEMORY_PRESSURE),
    ("DiskPressure", "True", TAINT_DISK_PRESSURE),
    ("NetworkUnavailable", "True", TAINT_NETWORK_UNAVAILABLE),
    ("PIDPressure", "True", TAINT_PID_PRESSURE),
];

/// The conditions set to Unknown when a Node goes quiet (NetworkUnavailable is the control
/// plane's, left alone as upstream does).
const QUIET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// A taint of `key` and `effect`, no value.
pub fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    }
}

/// `TaintExists`: a taint of the same key and effect.
pub fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node_taints(node)
        .iter()
        .any(|t| t.key == key && t.effect == effect)
}

/// The Node's condition of `type_`.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
}

/// What the controller remembers of a Node between passes (`nodeHealthData`).
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// When a heartbeat (a new Ready heartbeat time or Lease renewal) was last seen.
    pub probe: Timestamp,
    /// When the Ready condition was last seen to change.
    pub ready_transition: Timestamp,
    /// The Ready condition as last seen (after the controller's own change).
    pub ready: Option<NodeCondition>,
    /// The Lease as last seen: `Some(renewTime)` once one was.
    pub lease: Option<Option<Timestamp>>,
}

/// The settings the health check reads.
#[derive(Debug, Clone, Copy)]
pub struct Grace {
    pub startup: std::time::Duration,
    pub monitor: std::time::Duration,
}

/// One Node's look (`tryUpdateNodeHealth`).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// What to remember (before any write).
    pub health: Health,
    /// The Ready condition as the Node carried it (a made-up Unknown one when it has none).
    pub observed_ready: NodeCondition,
    /// The conditions to write, when the Node went quiet and its Ready condition changes.
    pub write: Option<Vec<NodeCondition>>,
    /// The Ready condition after this look (the written one, or the Node's).
    pub current_ready: Option<NodeCondition>,
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn same_time(a: &Option<Time>, b: &Option<Time>) -> bool {
    a.as_ref().map(|t| t.0) == b.as_ref().map(|t| t.0)
}

/// The saved health as the controller may judge it after its Lease watch failed and came back
/// at `recovered_at`: no renewal could be seen meanwhile, so the node's last heartbeat counts
/// from then. A node that stays quiet is still marked Unknown, one grace period after the
/// watch came back. (kube-controller-manager counts the blind time against every node: after
/// an API server outage longer than the grace period, every node goes NotReady and its Pods
/// leave the endpoints before the kubelets' next renewal is seen; it resets the probe times only
/// when it leaves full-disruption mode.)
pub fn probe_after_blindness(
    saved: Option<&Health>,
    recovered_at: Option<Timestamp>,
) -> Option<Health> {
    let mut h = saved?.clone();
    if let Some(t) = recovered_at.filter(|t| h.probe < *t) {
        h.probe = t;
    }
    Some(h)
}

/// `tryUpdateNodeHealth`: `lease` is the Node's Lease in kube-node-lease (`Some(renewTime)`)
/// when there is one.
pub fn check_health(
    saved: Option<&Health>,
    node: &Node,
    lease: Option<Option<Timestamp>>,
    now: Timestamp,
    grace: Grace,
) -> HealthCheck {
    let created = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let current = condition(node, "Ready").cloned();
    let mut saved = saved.cloned();
    let (observed_ready, grace_period) = match &current {
        None => {
            let observed = NodeCondition {
                type_: "Ready".into(),
                status: "Unknown".into(),
                last_heartbeat_time: Some(time(created)),
                last_transition_time: Some(time(created)),
                ..Default::default()
            };
            match &mut saved {
                Some(h) => h.ready = None,
                None => {
                    saved = Some(Health {
                        probe: created,
                        ready_transition: created,
                        ready: None,
                        lease: None,
                    })
                }
            }
            (observed, grace.startup)
        }
        Some(c) => (c.clone(), grace.monitor),
    };
    // Read before the cases below, which may start the remembered health afresh (without the
    // Lease: upstream's new nodeHealthData has none).
    let saved_lease = saved.as_ref().and_then(|h| h.lease);
    let fresh = |ready: Option<NodeCondition>, transition: Timestamp| Health {
        probe: now,
        ready_transition: transition,
        ready,
        lease: None,
    };
    let mut health = match saved {
        None => fresh(current.clone(), now),
        Some(h) => match (&h.ready, &current) {
            (None, Some(_)) => fresh(current.clone(), now),
            (Some(s), Some(c)) if !same_time(&s.last_heartbeat_time, &c.last_heartbeat_time) => {
                let transition = if !same_time(&s.last_transition_time, &c.last_transition_time) {
                    now
                } else {
                    h.ready_transition
                };
                fresh(current.clone(), transition)
            }
            // Nothing new: remembered as it was.
            _ => h,
        },
    };
    // A Lease renewed since the one remembered is a heartbeat.
    if let Some(renew) = lease {
        let newer = match saved_lease {
            None => true,
            Some(saved) => matches!((saved, renew), (Some(a), Some(b)) if a < b),
        };
        if newer {
            health.lease = Some(renew);
            health.probe = now;
        }
    }
    let mut check = HealthCheck {
        current_ready: current.clone(),
        observed_ready,
        write: None,
        health,
    };
    let deadline = check
        .health
        .probe
        .checked_add(SignedDuration::try_from(grace_period).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    if now <= deadline {
        return check;
    }
    let mut conditions: Vec<NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for type_ in QUIET_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            None => conditions.push(NodeCondition {
                type_: type_.into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: Some(time(created)),
                last_transition_time: Some(time(now)),
            }),
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(time(now));
            }
            Some(_) => {}
        }
    }
    let ready = conditions.iter().find(|c| c.type_ == "Ready").cloned();
    // The controller's own change is what it remembers, written or not (upstream's nodeHealth
    // points at the status it changes in place).
    check.health.ready = ready.clone();
    if ready.as_ref() != Some(&check.observed_ready) {
        check.write = Some(conditions);
    }
    check.current_ready = ready;
    check
}

/// `doNoScheduleTaintingPass`: the NoSchedule taints the Node's conditions and
/// `spec.unschedulable` call for, against the ones of those keys it has: (to add, to remove).
pub fn no_schedule_taints(node: &Node) -> (Vec<Taint>, Vec<Taint>) {
    let mut want: Vec<Taint> = Vec::new();
    for c in node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
    {
        if let Some((_, _, key)) = CONDITION_TAINTS
            .iter()
            .find(|(t, s, _)| *t == c.type_ && *s == c.status)
        {
            want.push(taint(key, TAINT_EFFECT_NO_SCHEDULE));
        }
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        want.push(taint(TAINT_UNSCHEDULABLE, TAINT_EFFECT_NO_SCHEDULE));
    }
    let have: Vec<&Taint> = node_taints(node)
        .iter()
        .filter(|t| {
            t.effect == TAINT_EFFECT_NO_SCHEDULE
                && (t.key == TAINT_UNSCHEDULABLE
                    || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key))
        })
        .collect();
    // TaintSetDiff: matched by key and effect.
    let add = want
        .iter()
        .filter(|w| !have.iter().any(|h| h.key == w.key && h.effect == w.effect))
        .cloned()
        .collect();
    let remove = have
        .iter()
        .filter(|h| !want.iter().any(|w| h.key == w.key && h.effect == w.effect))
        .map(|t| (*t).clone())
        .collect();
    (add, remove)
}

/// The Node's taints after removing `remove` (by key and effect) and adding or updating `add`
/// (`AddOrUpdateTaint` then `RemoveTaint`), or `None` when nothing changes.
pub fn swapped_taints(current: &[Taint], add: &[Taint], remove: &[Taint]) -> Option<Vec<Taint>> {
    let mut out: Vec<Taint> = current.to_vec();
    let mut changed = false;
    for a in add {
        match out
            .iter_mut()
            .find(|t| t.key == a.key && t.effect == a.effect)
        {
            Some(t) if t == a => {}
            Some(t) => {
                *t = a.clone();
                changed = true;
            }
            None => {
                out.push(a.clone());
                changed = true;
            }
        }
    }
    let before = out.len();
    out.retain(|t| {
        !remove
            .iter()
            .any(|r| r.key == t.key && r.effect == t.effect)
    });
    changed |= out.len() != before;
    changed.then_some(out)
}

/// `labelReconcileInfo`: the beta OS and arch labels follow the stable ones.
pub fn labels_to_reconcile(node: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(labels) = node.metadata.labels.as_ref() else {
        return out;
    };
    for (primary, secondary) in [
        ("kubernetes.io/os", "beta.kubernetes.io/os"),
        ("kubernetes.io/arch", "beta.kubernetes.io/arch"),
    ] {
        let Some(p) = labels.get(primary) else {
            continue;
        };
        if labels.get(secondary) != Some(p) {
            out.insert(secondary.to_string(), p.clone());
        }
    }
    out
}

/// `GetZoneKey`: "" without region and zone labels (the beta ones first).
pub fn zone_key(node: &Node) -> String {
    let Some(labels) = node.metadata.labels.as_ref() else {
        return String::new();
    };
    let zone = labels
        .get("failure-domain.beta.kubernetes.io/zone")
        .or_else(|| labels.get("topology.kubernetes.io/zone"))
        .cloned()
        .unwrap_or_default();
    let region = labels
        .get("failure-domain.beta.kubernetes.io/region")
        .or_else(|| labels.get("topology.kubernetes.io/region"))
        .cloned()
        .unwrap_or_default();
    if region.is_empty() && zone.is_empty() {
        return String::new();
    }
    format!("{region}:\x00:{zone}")
}

/// `isNodeExcludedFromDisruptionChecks`.
pub fn excluded_from_disruption(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_EXCLUDE_DISRUPTION))
}

/// A zone's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneState {
    Initial,
    Normal,
    FullDisruption,
    PartialDisruption,
}

/// The eviction settings.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    pub eviction: f32,
    pub secondary_eviction: f32,
    pub large_cluster_threshold: i32,
    pub unhealthy_zone_threshold: f32,
}

impl Rates {
    /// `ComputeZoneState` over the Ready statuses (`None`: no Ready condition) of a zone's Nodes:
    /// (not Ready, state).
    pub fn zone_state(&self, ready: &[Option<String>]) -> (usize, ZoneState) {
        let ready_nodes = ready
            .iter()
            .filter(|s| s.as_deref() == Some("True"))
            .count();
        let not_ready = ready.len() - ready_nodes;
        let state = if ready_nodes == 0 && not_ready > 0 {
            ZoneState::FullDisruption
        } else if not_ready > 2
            && (not_ready as f32) / (ready.len() as f32) >= self.unhealthy_zone_threshold
        {
            ZoneState::PartialDisruption
        } else {
            ZoneState::Normal
        };
        (not_ready, state)
    }

    /// `setLimiterInZone`: the rate a zone of `size` Nodes in `state` taints at (`None`: leave).
    pub fn qps(&self, state: ZoneState, size: usize) -> Option<f32> {
        match state {
            ZoneState::Normal | ZoneState::FullDisruption => Some(self.eviction),
            ZoneState::PartialDisruption => {
                Some(if size as i64 > self.large_cluster_threshold as i64 {
                    self.secondary_eviction
                } else {
                    0.0
                })
            }
            ZoneState::Initial => None,
        }
    }
}

/// What `handleDisruption` decided.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Disruption {
    /// Every zone went fully disrupted: remove the NoExecute taints of every Node, stop tainting.
    pub entered_full: bool,
    /// Leaving full disruption: every Node's probe and transition times become now.
    pub left_full: bool,
    /// Zones whose tainting rate changes, and to what.
    pub rates: Vec<(String, f32)>,
}

/// The zones' states (`zoneStates`).
#[derive(Debug, Default, Clone)]
pub struct Zones {
    pub states: HashMap<String, ZoneState>,
}

impl Zones {
    /// `handleDisruption`: `ready` holds each zone's Nodes' Ready statuses (Nodes excluded from
    /// disruption checks left out).
    pub fn handle(
        &mut self,
        ready: &BTreeMap<String, Vec<Option<String>>>,
        rates: &Rates,
    ) -> Disruption {
        let mut out = Disruption::default();
        let mut new_states = HashMap::new();
        let mut all_are_full = true;
        for (zone, statuses) in ready {
            let (_, state) = rates.zone_state(statuses);
            if state != ZoneState::FullDisruption {
                all_are_full = false;
            }
            new_states.insert(zone.clone(), state);
            self.states
                .entry(zone.clone())
                .or_insert(ZoneState::Initial);
        }
        let mut all_were_full = true;
        let mut zones: Vec<String> = self.states.keys().cloned().collect();
        zones.sort();
        for zone in zones {
            if !ready.contains_key(&zone) {
                self.states.remove(&zone);
                continue;
            }
            if self.states[&zone] != ZoneState::FullDisruption {
                all_were_full = false;
                break;
            }
        }
        if all_are_full && all_were_full {
            return out;
        }
        if all_are_full {
            out.entered_full = true;
            for (zone, state) in self.states.iter_mut() {
                out.rates.push((zone.clone(), 0.0));
                *state = ZoneState::FullDisruption;
            }
            out.rates.sort_by(|a, b| a.0.cmp(&b.0));
            return out;
        }
        if all_were_full {
            out.left_full = true;
        }
        for (zone, state) in self.states.iter_mut() {
            let new = new_states.get(zone).copied().unwrap_or(ZoneState::Initial);
            if !all_were_full && *state == new {
                continue;
            }
            let size = ready.get(zone).map_or(0, Vec::len);
            if let Some(qps) = rates.qps(new, size) {
                out.rates.push((zone.clone(), qps));
            }
            *state = new;
        }
        out.rates.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// A token bucket of burst 1 (`NewTokenBucketRateLimiter(qps, 1)`), full when made; a rate of
/// 0 or less never accepts (`NewFakeNeverRateLimiter`).
#[derive(Debug, Clone)]
pub struct Limiter {
    qps: f32,
    tokens: f64,
    last: std::time::Instant,
}

impl Limiter {
    pub fn new(qps: f32, now: std::time::Instant) -> Limiter {
        Limiter {
            qps,
            tokens: 1.0,
            last: now,
        }
    }

    pub fn qps(&self) -> f32 {
        self.qps
    }

    /// `TryAccept`.
    pub fn try_accept(&mut self, now: std::time::Instant) -> bool {
        if self.qps <= 0.0 {
            return false;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.qps as f64).min(1.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One zone's queue of Nodes to taint NoExecute (`RateLimitedTimedQueue`): a Node is added once
/// and stays known after it was handled until it is removed, so it is tainted once per spell of
/// not being Ready.
#[derive(Debug, Clone)]
pub struct TaintQueue {
    /// (process at, node name) in order.
    queue: Vec<(std::time::Instant, String)>,
    known: std::collections::HashSet<String>,
    limiter: Limiter,
}

impl TaintQueue {
    pub fn new(qps: f32, now: std::time::Instant) -> TaintQueue {
        TaintQueue {
            queue: Vec::new(),
            known: Default::default(),
            limiter: Limiter::new(qps, now),
        }
    }

    /// `Add`: false when the Node is known already.
    pub fn add(&mut self, node: &str, now: std::time::Instant) -> bool {
        if !self.known.insert(node.to_string()) {
            return false;
        }
        self.queue.push((now, node.to_string()));
        self.queue.sort_by_key(|(at, _)| *at);
        true
    }

    /// `Remove`: forgotten, to be added again.
    pub fn remove(&mut self, node: &str) -> bool {
        self.queue.retain(|(_, n)| n != node);
        self.known.remove(node)
    }

    /// The Nodes due now, as many as the limiter lets through (`Try`'s loop; the caller hands
    /// back the ones to retry with [`TaintQueue::retry`]).
    pub fn take_due(&mut self, now: std::time::Instant) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((at, _)) = self.queue.first() {
            if !self.limiter.try_accept(now) {
                break;
            }
            if now < *at {
                break;
            }
            out.push(self.queue.remove(0).1);
        }
        out
    }

    /// A Node to look at again after `after` (still known).
    pub fn retry(&mut self, node: &str, at: std::time::Instant) {
        if self.known.contains(node) {
            self.queue.push((at, node.to_string()));
            self.queue.sort_by_key(|(at, _)| *at);
        }
    }

    /// `SwapLimiter`: a new bucket when the rate changes, drained when the old one was.
    pub fn set_rate(&mut self, qps: f32, now: std::time::Instant) {
        if self.limiter.qps() == qps {
            return;
        }
        let drained = !self.limiter.try_accept(now);
        self.limiter = Limiter::new(qps, now);
        if drained {
            self.limiter.try_accept(now);
        }
    }
}

/// What the NoExecute pass does for a Node whose Ready status is `ready`
/// (`processTaintBaseEviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Swap the other NoExecute taint for this one now (the Node has the other).
    SwapNow {
        add: &'static str,
        remove: &'static str,
    },
    /// Queue the Node for the rate-limited taint (forgotten first when it lacks the taint).
    Queue { forget_first: bool },
    /// Ready: remove both NoExecute taints and forget the Node.
    Reachable,
}

pub fn eviction(node: &Node, ready: &str) -> Eviction {
    let (mine, other) = match ready {
        "False" => (TAINT_NOT_READY, TAINT_UNREACHABLE),
        "Unknown" => (TAINT_UNREACHABLE, TAINT_NOT_READY),
        _ => return Eviction::Reachable,
    };
    if has_taint(node, other, TAINT_EFFECT_NO_EXECUTE) {
        return Eviction::SwapNow {
            add: mine,
            remove: other,
        };
    }
    Eviction::Queue {
        forget_first: !has_taint(node, mine, TAINT_EFFECT_NO_EXECUTE),
    }
}

/// The NoExecute taint the rate-limited pass puts on a Node of Ready status `ready`, and the one
/// it removes; `None` when the Node is Ready again.
pub fn no_execute_swap(ready: &str) -> Option<(&'static str, &'static str)> {
    match ready {
        "False" => Some((TAINT_NOT_READY, TAINT_UNREACHABLE)),
        "Unknown" => Some((TAINT_UNREACHABLE, TAINT_NOT_READY)),
        _ => None,
    }
}

/// `MarkPodsNotReady` for one Pod of uid `uid` and Ready status `ready`: the status patch
/// turning its Ready condition False (`UpdatePodCondition`: the transition time moves with the
/// status), `None` when it has no Ready condition or it is False already.
pub fn pod_not_ready_patch(
    uid: Option<&str>,
    ready: Option<&str>,
    now: Timestamp,
) -> Option<serde_json::Value> {
    if ready? == "False" {
        return None;
    }
    Some(json!({
        "metadata": {"uid": uid},
        "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]},
    }))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
