//! The namespace status conditions the namespace controller maintains while it empties a
//! namespace (upstream's `status_condition_utils.go`): what went wrong this round becomes a
//! condition with status True and upstream's reason and message; every other of the five types
//! is set to its "ok" variant (status False), so a condition that stopped failing says so.
//!
//! Owns: computing the conditions. Pure: the caller writes them with an UpdateStatus.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NamespaceCondition, NamespaceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::discovery::Gvr;

/// Discovery of the namespaced resources failed (partly or wholly).
pub const DISCOVERY_FAILURE: &str = "NamespaceDeletionDiscoveryFailure";
/// A discovered group version did not parse.
pub const GROUP_VERSION_PARSING_FAILURE: &str = "NamespaceDeletionGroupVersionParsingFailure";
/// Deleting some resource type failed.
pub const CONTENT_FAILURE: &str = "NamespaceDeletionContentFailure";
/// Objects remain in the namespace.
pub const CONTENT_REMAINING: &str = "NamespaceContentRemaining";
/// Objects in the namespace wait on their finalizers.
pub const FINALIZERS_REMAINING: &str = "NamespaceFinalizersRemaining";

/// The condition types the controller maintains, in the order it writes them.
pub const TYPES: [&str; 5] = [
    DISCOVERY_FAILURE,
    GROUP_VERSION_PARSING_FAILURE,
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    FINALIZERS_REMAINING,
];

/// The "ok" reason and message of a condition type (upstream's `okReasons` / `okMessages`).
pub fn ok_variant(type_: &str) -> (&'static str, &'static str) {
    match type_ {
        DISCOVERY_FAILURE => (
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        GROUP_VERSION_PARSING_FAILURE => (
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        CONTENT_FAILURE => (
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        CONTENT_REMAINING => ("ContentRemoved", "All content successfully removed"),
        FINALIZERS_REMAINING => (
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
        _ => ("", ""),
    }
}

/// What remains in the namespace after a round (upstream's `allGVRDeletionMetadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentTotals {
    /// Objects remaining per resource.
    pub remaining: BTreeMap<Gvr, usize>,
    /// Objects remaining per finalizer they carry.
    pub finalizers: BTreeMap<String, usize>,
}

/// The conditions of one round, collected as it goes (upstream's `namespaceConditionUpdater`).
#[derive(Clone, Debug, Default)]
pub struct ConditionUpdater {
    failing: Vec<(String, String, String)>,
    content_errors: Vec<String>,
}

impl ConditionUpdater {
    /// Discovery failed: `failed_groups` is the number of group versions that failed when
    /// discovery was partial (client-go's `ErrGroupDiscoveryFailed`), None when it failed whole.
    pub fn discovery_failed(&mut self, err: &str, failed_groups: Option<usize>) {
        let message = match failed_groups {
            Some(n) => format!("Discovery failed for some groups, {n} failing: {err}"),
            None => err.to_string(),
        };
        self.fail(DISCOVERY_FAILURE, "DiscoveryFailed", message);
    }

    /// A group version did not parse.
    pub fn group_version_failed(&mut self, err: &str) {
        self.fail(
            GROUP_VERSION_PARSING_FAILURE,
            "GroupVersionParsingFailed",
            err.to_string(),
        );
    }

    /// Deleting one resource type failed.
    pub fn delete_content_failed(&mut self, err: &str) {
        self.content_errors.push(err.to_string());
    }

    /// What remains: the ContentRemaining and FinalizersRemaining conditions (each list sorted,
    /// so the message is stable across rounds).
    pub fn content_totals(&mut self, totals: &ContentTotals) {
        if !totals.remaining.is_empty() {
            let mut parts: Vec<String> = totals
                .remaining
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(gvr, n)| {
                    format!("{}.{} has {n} resource instances", gvr.resource, gvr.group)
                })
                .collect();
            parts.sort();
            self.fail(
                CONTENT_REMAINING,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", parts.join(", ")),
            );
        }
        if !totals.finalizers.is_empty() {
            let mut parts: Vec<String> = totals
                .finalizers
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(f, n)| format!("{f} in {n} resource instances"))
                .collect();
            parts.sort();
            self.fail(
                FINALIZERS_REMAINING,
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    parts.join(", ")
                ),
            );
        }
    }

    fn fail(&mut self, type_: &str, reason: &str, message: String) {
        self.failing
            .push((type_.to_string(), reason.to_string(), message));
    }

    /// The content failure condition of the collected errors (sorted messages).
    fn content_failure(&self) -> Option<(String, String, String)> {
        if self.content_errors.is_empty() {
            return None;
        }
        let mut msgs = self.content_errors.clone();
        msgs.sort();
        Some((
            CONTENT_FAILURE.to_string(),
            "ContentDeletionFailed".to_string(),
            format!(
                "Failed to delete all resource types, {} remaining: {}",
                msgs.len(),
                msgs.join(", ")
            ),
        ))
    }

    /// Writes the round's conditions into `status` at `now`: each of the five types is the
    /// failure collected for it, else its ok variant. A condition whose status, reason or message
    /// changes is rewritten in place (its transition time moves only when the status does); a
    /// missing one is appended. True when anything changed (the caller then updates the status).
    pub fn update(&self, status: &mut NamespaceStatus, now: Timestamp) -> bool {
        let mut failing = self.failing.clone();
        if !failing.iter().any(|(t, _, _)| t == CONTENT_FAILURE) {
            failing.extend(self.content_failure());
        }
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let mut changed = false;
        for type_ in TYPES {
            let (state, reason, message) = match failing.iter().find(|(t, _, _)| t == type_) {
                Some((_, r, m)) => ("True", r.clone(), m.clone()),
                None => {
                    let (r, m) = ok_variant(type_);
                    ("False", r.to_string(), m.to_string())
                }
            };
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                None => {
                    conditions.push(NamespaceCondition {
                        type_: type_.to_string(),
                        status: state.to_string(),
                        reason: Some(reason),
                        message: Some(message),
                        last_transition_time: Some(Time(now)),
                    });
                    changed = true;
                }
                Some(old) => {
                    let same = old.status == state
                        && old.reason.as_deref() == Some(reason.as_str())
                        && old.message.as_deref() == Some(message.as_str());
                    if !same {
                        if old.status != state {
                            old.last_transition_time = Some(Time(now));
                        }
                        old.status = state.to_string();
                        old.reason = Some(reason);
                        old.message = Some(message);
                        changed = true;
                    }
                }
            }
        }
        changed
    }
}

#[cfg(test)]
#[path = "conditions_tests.rs"]
mod tests;
