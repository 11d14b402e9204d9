//! The disruption controller's decisions over cached state, with no API calls: which Pods a
//! budget covers, how many Pods it expects and wants healthy (`getExpectedPodCount`), which of
//! them are healthy (`countHealthyPods`), which evictions the API server recorded are still
//! pending (`buildDisruptedPodMap`), the status to write and its `DisruptionAllowed` condition
//! (`updatePdbStatus`, component-helpers' `UpdateDisruptionAllowedCondition`), the status of a
//! failed sync (`failSafe`) and when a Pod's `DisruptionTarget` condition has gone stale.
//!
//! Owns the arithmetic and the condition bookkeeping; which controller owns a Pod and its scale
//! are the caller's (the finders in [`super::finders`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::helpers::intstr::scaled_value;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::pods::is_pod_ready;

/// How long after the API server recorded an eviction the Pod must have been seen deleting
/// (upstream's `DeletionTimeout`); after that the entry is dropped and the Pod counts again.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a running Pod keeps a `DisruptionTarget=True` condition nobody followed with a
/// deletion before it is reset to False (upstream's `stalePodDisruptionTimeout`).
pub const STALE_POD_DISRUPTION_TIMEOUT: Duration = Duration::from_secs(120);

/// The PDB condition this controller owns and its reasons (`policy.DisruptionAllowedCondition`,
/// `SufficientPodsReason`, `InsufficientPodsReason`, `SyncFailedReason`).
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
pub const SUFFICIENT_PODS: &str = "SufficientPods";
pub const INSUFFICIENT_PODS: &str = "InsufficientPods";
pub const SYNC_FAILED: &str = "SyncFailed";

/// The Pod condition an eviction (or preemption, taint eviction, ...) sets before deleting.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// The reason of the kubelet's DisruptionTarget, which never goes stale
/// (`v1.PodReasonTerminationByKubelet`).
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// How a budget's expected Pod count is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counting {
    /// An integer `minAvailable`: the Pods the selector finds are the expected ones and the
    /// integer is the healthy count wanted; no controller is looked at.
    ByPods { desired_healthy: i32 },
    /// `maxUnavailable` (any form) or a percentage `minAvailable`: the sum of the scales of the
    /// Pods' controllers is the expected count.
    ByScale,
    /// Neither field set (the API server refuses that): nothing expected, nothing wanted.
    Nothing,
}

/// Which way [`Counting`] the spec asks for (`getExpectedPodCount`'s branches).
pub fn counting(spec: &PodDisruptionBudgetSpec) -> Counting {
    if spec.max_unavailable.is_some() {
        return Counting::ByScale;
    }
    match &spec.min_available {
        Some(IntOrString::Int(n)) => Counting::ByPods {
            desired_healthy: *n,
        },
        Some(IntOrString::String(_)) => Counting::ByScale,
        None => Counting::Nothing,
    }
}

/// `(expectedPods, desiredHealthy)` given the Pods found (`pods`) and, for [`Counting::ByScale`],
/// the sum of the controllers' scales. `maxUnavailable` and percentages round up, as upstream
/// (`GetScaledValueFromIntOrPercent(..., true)`); desiredHealthy from `maxUnavailable` is never
/// below 0. A malformed value is the error upstream's intstr gives.
pub fn expected_and_desired(
    spec: &PodDisruptionBudgetSpec,
    pods: usize,
    scale: i32,
) -> Result<(i32, i32), String> {
    if let Some(max) = &spec.max_unavailable {
        let unavailable = scaled_value(max, scale, true)?;
        return Ok((scale, (scale - unavailable).max(0)));
    }
    match &spec.min_available {
        Some(IntOrString::Int(n)) => Ok((i32::try_from(pods).unwrap_or(i32::MAX), *n)),
        Some(min @ IntOrString::String(_)) => Ok((scale, scaled_value(min, scale, true)?)),
        None => Ok((0, 0)),
    }
}

/// `countHealthyPods`: Ready Pods that are neither being deleted nor in `disrupted` with an
/// eviction younger than [`DELETION_TIMEOUT`].
pub fn count_healthy(
    pods: &[&CachedPod],
    disrupted: &BTreeMap<String, Time>,
    now: Timestamp,
) -> i32 {
    let mut healthy = 0;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if let Some(t) = disrupted.get(name) {
            if expires(t) > now {
                continue;
            }
        }
        if is_pod_ready(pod) {
            healthy += 1;
        }
    }
    healthy
}

fn expires(t: &Time) -> Timestamp {
    t.0.saturating_add(SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// What [`disrupted_pod_map`] decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Disrupted {
    /// The entries to keep: Pods still there, not being deleted, whose eviction has not expired.
    pub pods: BTreeMap<String, Time>,
    /// When the earliest kept entry expires (the budget is synced again then).
    pub recheck: Option<Timestamp>,
    /// Pods whose eviction expired without a deletion (a `NotDeleted` Warning each).
    pub not_deleted: Vec<String>,
}

/// `buildDisruptedPodMap`: the status's `disruptedPods` minus Pods that are gone or being
/// deleted (the eviction did its work) and Pods whose eviction is older than
/// [`DELETION_TIMEOUT`] (it did not).
pub fn disrupted_pod_map(
    pods: &[&CachedPod],
    previous: Option<&BTreeMap<String, Time>>,
    now: Timestamp,
) -> Disrupted {
    let mut out = Disrupted::default();
    let Some(previous) = previous else {
        return out;
    };
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(t) = previous.get(name) else {
            continue;
        };
        let expected_deletion = expires(t);
        if expected_deletion < now {
            out.not_deleted.push(name.to_string());
        } else {
            if out.recheck.is_none_or(|r| expected_deletion < r) {
                out.recheck = Some(expected_deletion);
            }
            out.pods.insert(name.to_string(), t.clone());
        }
    }
    out
}

/// `disruptionsAllowed`: healthy beyond desired, and 0 while no Pod is expected (a budget whose
/// first Pods appear before its status is updated stays safe).
pub fn disruptions_allowed(current_healthy: i32, desired_healthy: i32, expected: i32) -> i32 {
    let allowed = current_healthy - desired_healthy;
    if expected <= 0 || allowed <= 0 {
        0
    } else {
        allowed
    }
}

/// `meta.SetStatusCondition`: replaces the condition of the same type field by field; the
/// transition time changes only with the status.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => conditions.push(new),
        Some(c) => {
            if c.status != new.status {
                c.status = new.status;
                c.last_transition_time = new.last_transition_time;
            }
            c.reason = new.reason;
            c.message = new.message;
            c.observed_generation = new.observed_generation;
        }
    }
}

fn allowed_condition(status: &PodDisruptionBudgetStatus, now: Timestamp) -> Condition {
    let (st, reason) = if status.disruptions_allowed > 0 {
        ("True", SUFFICIENT_PODS)
    } else {
        ("False", INSUFFICIENT_PODS)
    };
    Condition {
        type_: DISRUPTION_ALLOWED.into(),
        status: st.into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: status.observed_generation,
        last_transition_time: Time(now),
    }
}

/// component-helpers' `ConditionsAreUpToDate`: the condition is there and says what
/// `disruptionsAllowed` says, for the current generation.
pub fn conditions_up_to_date(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = &pdb.status else {
        return false;
    };
    let Some(c) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED)
    else {
        return false;
    };
    if status.observed_generation != pdb.metadata.generation {
        return false;
    }
    if status.disruptions_allowed > 0 {
        c.status == "True" && c.reason == SUFFICIENT_PODS
    } else {
        c.status == "False" && c.reason == INSUFFICIENT_PODS
    }
}

/// The counts of one sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub expected: i32,
}

/// `updatePdbStatus`: the status to write, `None` when the current one already says it all
/// (counts, disrupted Pods, observed generation, condition). An empty `disruptedPods` equals a
/// missing one, as apimachinery's semantic equality has it.
pub fn new_status(
    pdb: &PodDisruptionBudget,
    counts: Counts,
    disrupted: BTreeMap<String, Time>,
    now: Timestamp,
) -> Option<PodDisruptionBudgetStatus> {
    let allowed = disruptions_allowed(
        counts.current_healthy,
        counts.desired_healthy,
        counts.expected,
    );
    let old = pdb.status.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    if old.current_healthy == counts.current_healthy
        && old.desired_healthy == counts.desired_healthy
        && old.expected_pods == counts.expected
        && old.disruptions_allowed == allowed
        && old.disrupted_pods.as_ref().unwrap_or(&empty) == &disrupted
        && old.observed_generation == pdb.metadata.generation
        && conditions_up_to_date(pdb)
    {
        return None;
    }
    let mut status = PodDisruptionBudgetStatus {
        current_healthy: counts.current_healthy,
        desired_healthy: counts.desired_healthy,
        expected_pods: counts.expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: pdb.metadata.generation,
        conditions: None,
    };
    let mut conditions = old.conditions.unwrap_or_default();
    set_condition(&mut conditions, allowed_condition(&status, now));
    status.conditions = Some(conditions);
    Some(status)
}

/// `failSafe`: the current status with no disruption allowed and the condition False, reason
/// SyncFailed, the error as its message (for the generation the status last observed).
pub fn fail_safe_status(
    pdb: &PodDisruptionBudget,
    message: &str,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let mut conditions = status.conditions.take().unwrap_or_default();
    set_condition(
        &mut conditions,
        Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: "False".into(),
            reason: SYNC_FAILED.into(),
            message: message.into(),
            observed_generation: status.observed_generation,
            last_transition_time: Time(now),
        },
    );
    status.conditions = Some(conditions);
    status
}

/// `nonTerminatingPodHasStaleDisruptionCondition`: for a Pod not being deleted, not terminal,
/// with `DisruptionTarget=True` set by anyone but the kubelet, how long until that condition is
/// stale (zero: it is); `None` for any other Pod.
pub fn stale_disruption_in(pod: &CachedPod, now: Timestamp, timeout: Duration) -> Option<Duration> {
    if pod.metadata.deletion_timestamp.is_some() || pod.is_terminal() {
        return None;
    }
    let cond = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == DISRUPTION_TARGET)?;
    if cond.status != "True" || cond.reason.as_deref() == Some(TERMINATION_BY_KUBELET) {
        return None;
    }
    let since = cond
        .last_transition_time
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    let elapsed = now.duration_since(since);
    let left = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX) - elapsed;
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

/// `metav1.LabelSelector`'s Go `String()` (gogo-protobuf's), as upstream prints a budget's
/// selector in the UnmanagedPods Event: `&LabelSelector{MatchLabels:map[string]string{k: v,},
/// MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:k,Operator:In,
/// Values:[a b],},},}`; `nil` for none.
pub fn go_selector_string(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "nil".into();
    };
    let mut labels = String::from("map[string]string{");
    for (k, v) in sel.match_labels.iter().flatten() {
        labels.push_str(&format!("{k}: {v},"));
    }
    labels.push('}');
    let mut exprs = String::from("[]LabelSelectorRequirement{");
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(" ");
        exprs.push_str(&format!(
            "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{values}],}},",
            e.key, e.operator
        ));
    }
    exprs.push('}');
    format!("&LabelSelector{{MatchLabels:{labels},MatchExpressions:{exprs},}}")
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
