//! The taint eviction controller's decisions, pure (upstream's `getNoExecuteTaints`,
//! `v1helper.GetMatchingTolerations`, `getMinTolerationTime` and `processPodOnNode`): which of a
//! Node's taints count, whether a Pod tolerates them and for how long, what becomes of a pending
//! eviction, and which informer changes are worth a look.
//!
//! Owns no state and makes no API call; times are whatever clock the caller keeps.

use std::ops::Add;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use crate::helpers::taints::{node_taints, tolerates_taint, TAINT_EFFECT_NO_EXECUTE};

/// The Node's NoExecute taints, in the Node's order (`getNoExecuteTaints`).
pub fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node_taints(node)
        .iter()
        .filter(|t| t.effect == TAINT_EFFECT_NO_EXECUTE)
        .cloned()
        .collect()
}

/// For each taint, the first toleration tolerating it; `None` when some taint is tolerated by
/// none (`GetMatchingTolerations`).
pub fn matching_tolerations<'a>(
    taints: &[Taint],
    tolerations: &'a [Toleration],
) -> Option<Vec<&'a Toleration>> {
    taints
        .iter()
        .map(|taint| tolerations.iter().find(|t| tolerates_taint(t, taint)))
        .collect()
}

/// How long the tolerations let a Pod stay (`getMinTolerationTime`): `None` for ever (none of
/// them has `tolerationSeconds`), otherwise the shortest `tolerationSeconds`, zero or below
/// meaning at once; no toleration at all is zero as well.
pub fn min_toleration_time(used: &[&Toleration]) -> Option<Duration> {
    if used.is_empty() {
        return Some(Duration::ZERO);
    }
    used.iter()
        .filter_map(|t| t.toleration_seconds)
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .min()
}

/// What a Pod's tolerations make of its Node's NoExecute taints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The Node has no NoExecute taint, or the Pod tolerates every one for ever.
    Stays,
    /// A taint is not tolerated: delete the Pod now.
    Untolerated,
    /// Every taint is tolerated, the shortest `tolerationSeconds` among the tolerations used this
    /// long.
    TolerantFor(Duration),
}

/// The verdict on a Pod with `tolerations` on a Node with NoExecute `taints`.
pub fn verdict(taints: &[Taint], tolerations: &[Toleration]) -> Verdict {
    if taints.is_empty() {
        return Verdict::Stays;
    }
    match matching_tolerations(taints, tolerations) {
        None => Verdict::Untolerated,
        Some(used) => match min_toleration_time(&used) {
            None => Verdict::Stays,
            Some(d) => Verdict::TolerantFor(d),
        },
    }
}

/// What becomes of the Pod's pending eviction (`processPodOnNode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// Cancel a pending eviction (with its "Cancelling deletion" Event when one was waiting).
    Cancel,
    /// Cancel a pending one, then evict now.
    EvictNow,
    /// Leave the pending eviction as it is.
    Keep,
    /// Cancel a pending one, then evict at `fire_at` (recorded as made at `created_at`).
    EvictAt { created_at: T, fire_at: T },
}

/// The step for `verdict` at `now`, given when the Pod's pending eviction (if one is waiting) was
/// made. A waiting eviction is kept unless it was made at this very moment: the time a Pod may
/// stay counts from when its eviction was first scheduled, so a longer toleration never
/// lengthens it, and a shorter one does not shorten it either (upstream's rule, stated by its
/// "lengthening toleration shouldn't work" case).
pub fn step<T>(verdict: Verdict, pending_since: Option<T>, now: T) -> Step<T>
where
    T: Copy + Ord + Add<Duration, Output = T>,
{
    match verdict {
        Verdict::Stays => Step::Cancel,
        Verdict::Untolerated => Step::EvictNow,
        Verdict::TolerantFor(d) => {
            let trigger = now + d;
            let created_at = match pending_since {
                Some(since) if since + d < trigger => return Step::Keep,
                Some(since) => since,
                None => now,
            };
            Step::EvictAt {
                created_at,
                fire_at: created_at + d,
            }
        }
    }
}

/// Whether a Pod change is worth a look (`PodUpdated`): an add, a delete, or a change of its
/// tolerations or its Node.
pub fn pod_change_matters(
    old: Option<(&str, &[Toleration])>,
    new: Option<(&str, &[Toleration])>,
) -> bool {
    match (old, new) {
        (Some((old_node, old_tol)), Some((new_node, new_tol))) => {
            old_node != new_node || old_tol != new_tol
        }
        _ => true,
    }
}

/// Whether a Node change is worth a look (`NodeUpdated`): an add, a delete, or a change of its
/// NoExecute taints.
pub fn node_change_matters(old: Option<&Node>, new: Option<&Node>) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => no_execute_taints(o) != no_execute_taints(n),
        _ => true,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
