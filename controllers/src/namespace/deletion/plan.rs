//! The namespace controller's decisions over what it read (upstream's
//! `namespaced_resources_deleter.go`, the parts that are arithmetic): how long the Pods of a
//! namespace may still take to end, what remains of a resource after its deletion (and whether
//! that is an error), the totals behind the content conditions, when to look again, and the
//! finalizers a namespace keeps once it is released.
//!
//! Owns: those decisions. Pure: no API call.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::conditions::ContentTotals;
use super::discovery::Gvr;

/// The finalizer the API server puts on every namespace and this controller removes
/// (`v1.FinalizerKubernetes`).
pub const FINALIZER_KUBERNETES: &str = "kubernetes";

/// How long to assume objects carrying finalizers still need (upstream's
/// `finalizerEstimateSeconds`).
pub const FINALIZER_ESTIMATE_SECONDS: i64 = 15;

/// The longest `terminationGracePeriodSeconds` of the Pods not yet Succeeded or Failed (0 when
/// none sets one): how long the namespace's Pods may take to end (upstream's
/// `estimateGracefulTerminationForPods`).
pub fn pods_estimate<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> i64 {
    pods.into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .fold(0, i64::max)
}

/// An estimate of `seconds` counted from the namespace's deletion: 0 once that long has passed
/// since `deleted_at` (upstream's `estimateGracefulTermination`).
pub fn bounded_estimate(seconds: i64, deleted_at: Timestamp, now: Timestamp) -> i64 {
    let elapsed = now.duration_since(deleted_at);
    if elapsed >= k8s_openapi::jiff::SignedDuration::from_secs(seconds) {
        0
    } else {
        seconds
    }
}

/// What remains of one resource after its deletion (upstream's `gvrDeletionMetadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GvrDeletion {
    /// Seconds to wait before looking again (0: no estimate, not "all gone").
    pub estimate: i64,
    /// Objects remaining.
    pub remaining: usize,
    /// Objects remaining per finalizer they carry.
    pub finalizers: BTreeMap<String, usize>,
}

/// The outcome of one resource's deletion from the list read after it: `remaining` holds each
/// remaining object's finalizers (None when the resource cannot be listed). Objects remaining
/// with an `estimate` (Pods ending gracefully) are expected; without one, objects with
/// finalizers are expected too (for [`FINALIZER_ESTIMATE_SECONDS`]); objects remaining with
/// neither are an error (upstream: "unexpected items still remain").
pub fn after_deletion(
    gvr: &Gvr,
    namespace: &str,
    estimate: i64,
    remaining: Option<&[Vec<String>]>,
) -> (GvrDeletion, Option<String>) {
    let Some(items) = remaining else {
        return (
            GvrDeletion {
                estimate,
                ..Default::default()
            },
            None,
        );
    };
    if items.is_empty() {
        return (GvrDeletion::default(), None);
    }
    let mut finalizers = BTreeMap::new();
    for f in items.iter().flatten() {
        *finalizers.entry(f.clone()).or_insert(0) += 1;
    }
    if estimate != 0 {
        return (
            GvrDeletion {
                estimate,
                remaining: items.len(),
                finalizers,
            },
            None,
        );
    }
    if !finalizers.is_empty() {
        return (
            GvrDeletion {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                remaining: items.len(),
                finalizers,
            },
            None,
        );
    }
    (
        GvrDeletion {
            estimate,
            remaining: items.len(),
            finalizers: BTreeMap::new(),
        },
        Some(format!(
            "unexpected items still remain in namespace: {namespace} for gvr: {}",
            gvr.go_string()
        )),
    )
}

/// Adds one resource's outcome to a round's totals (and its estimate to the round's, the
/// largest).
pub fn add_to_totals(totals: &mut ContentTotals, estimate: &mut i64, gvr: &Gvr, d: &GvrDeletion) {
    *estimate = (*estimate).max(d.estimate);
    if d.remaining > 0 {
        totals.remaining.insert(gvr.clone(), d.remaining);
        for (f, n) in &d.finalizers {
            if *n > 0 {
                *totals.finalizers.entry(f.clone()).or_insert(0) += n;
            }
        }
    }
}

/// The error upstream reports when the Pods (deleted first) failed.
pub fn pods_error(namespace: &str, err: &str) -> String {
    format!("failed to delete pods for namespace: {namespace}, err: {err}")
}

/// When to look at a namespace again whose content is still going (`estimate` seconds):
/// half of it plus a second, as upstream's worker.
pub fn requeue_after(estimate: i64) -> Duration {
    Duration::from_secs(u64::try_from(estimate / 2 + 1).unwrap_or(1))
}

/// The finalizers a namespace keeps once `token` is removed: the others, deduplicated and
/// sorted (upstream builds them through a string set).
pub fn without_finalizer(finalizers: &[String], token: &str) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| *f != token)
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
