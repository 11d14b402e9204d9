//! NodeAffinity (PreFilter, Filter, PreScore, Score): a Pod goes only to nodes matching its
//! `nodeSelector` and required node affinity (and the profile's `addedAffinity`); among those,
//! nodes matching more preferred terms (by weight) score higher. Upstream v1.34's `nodeaffinity`
//! plugin, including its PreFilter narrowing to the nodes named by `metadata.name` matchFields.
//! Reads only the Pod and node objects.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::helper::default_normalize_score;
use crate::helpers::nodeaffinity::{
    node_matches_pod, pod_node_affinity, required_node_selector, AffinityMismatch, NodeSelector,
    PreferredSchedulingTerms, RequiredNodeAffinity, OBJECT_NAME_FIELD,
};
use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, NodeScore, Plugin, PreFilterPlugin, PreFilterResult,
    PreScorePlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE,
};
use crate::scheduler::plugin_args::NodeAffinityArgs;

pub const NAME: &str = "NodeAffinity";

const PRE_FILTER_STATE_KEY: &str = "PreFilterNodeAffinity";
const PRE_SCORE_STATE_KEY: &str = "PreScoreNodeAffinity";

/// Upstream's ErrReasonPod.
pub const ERR_REASON_POD: &str = "node(s) didn't match Pod's node affinity/selector";
/// The reason when the profile's addedAffinity rejects the node.
pub const ERR_REASON_ENFORCED: &str = "node(s) didn't match scheduler-enforced node affinity";
/// PreFilter: the Pod's `metadata.name` terms leave no node.
pub const ERR_REASON_CONFLICT: &str = "pod affinity terms conflict";

/// The plugin with its parsed NodeAffinityArgs.
#[derive(Debug, Default)]
pub struct NodeAffinity {
    /// `addedAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    added_node_selector: Option<NodeSelector>,
    /// `addedAffinity.preferredDuringSchedulingIgnoredDuringExecution` (None when empty).
    added_preferred: Option<PreferredSchedulingTerms>,
}

impl NodeAffinity {
    /// From validated NodeAffinityArgs (`addedAffinity`: None is no added affinity); parsing
    /// cannot fail once [`NodeAffinityArgs::validate`](crate::scheduler::plugin_args::PluginArgs)
    /// passed, and names the field if it does.
    pub fn new(args: &NodeAffinityArgs) -> Result<Self, String> {
        let mut pl = NodeAffinity::default();
        let Some(added) = &args.added_affinity else {
            return Ok(pl);
        };
        if let Some(ns) = &added.required_during_scheduling_ignored_during_execution {
            let path =
                "NodeAffinityArgs.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution";
            pl.added_node_selector = Some(NodeSelector::parse_strict(ns, path)?);
        }
        if let Some(terms) = added
            .preferred_during_scheduling_ignored_during_execution
            .as_deref()
            .filter(|t| !t.is_empty())
        {
            let path =
                "NodeAffinityArgs.addedAffinity.preferredDuringSchedulingIgnoredDuringExecution";
            pl.added_preferred = Some(PreferredSchedulingTerms::parse(terms, path)?);
        }
        Ok(pl)
    }
}

/// The Pod's parsed required affinity, shared (preemption clones the cycle state per candidate).
#[derive(Debug, Clone)]
struct PreFilterState(Arc<RequiredNodeAffinity>);

/// The Pod's parsed preferred terms (None when the Pod has none).
#[derive(Debug, Clone)]
struct PreScoreState(Option<Arc<PreferredSchedulingTerms>>);

/// The Pod's preferred terms: None when the field is absent (an empty list still counts, as
/// upstream distinguishes nil from empty); an error status when one does not parse.
fn pod_preferred_terms(pod: &Pod) -> Result<Option<PreferredSchedulingTerms>, Status> {
    let Some(terms) = pod_node_affinity(pod).and_then(|a| {
        a.preferred_during_scheduling_ignored_during_execution
            .as_deref()
    }) else {
        return Ok(None);
    };
    PreferredSchedulingTerms::parse(
        terms,
        "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
    )
    .map(Some)
    .map_err(Status::error)
}

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodeAffinity {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let required = required_node_selector(pod);
        let has_node_selector = pod.spec.as_ref().is_some_and(|s| s.node_selector.is_some());
        if required.is_none() && self.added_node_selector.is_none() && !has_node_selector {
            return (None, Status::skip());
        }
        state.write(
            PRE_FILTER_STATE_KEY,
            PreFilterState(Arc::new(RequiredNodeAffinity::from_pod(pod))),
        );
        let Some(terms) = required
            .map(|r| &r.node_selector_terms)
            .filter(|t| !t.is_empty())
        else {
            return (None, Status::success());
        };
        // Terms are ORed, the `metadata.name In` requirements within a term ANDed: the Pod can
        // only go to the union over terms of each term's intersection. A term without such a
        // requirement allows every node.
        let mut node_names: BTreeSet<String> = BTreeSet::new();
        for term in terms {
            let mut term_names: Option<BTreeSet<&str>> = None;
            for r in term.match_fields.iter().flatten() {
                if r.key != OBJECT_NAME_FIELD || r.operator != "In" {
                    continue;
                }
                let values: BTreeSet<&str> =
                    r.values.iter().flatten().map(String::as_str).collect();
                term_names = Some(match term_names {
                    None => values,
                    Some(prev) => prev.intersection(&values).copied().collect(),
                });
            }
            let Some(term_names) = term_names else {
                return (None, Status::success());
            };
            node_names.extend(term_names.into_iter().map(str::to_string));
        }
        if node_names.is_empty() {
            return (None, Status::unresolvable(ERR_REASON_CONFLICT));
        }
        (
            Some(PreFilterResult {
                node_names: Some(node_names),
            }),
            Status::success(),
        )
    }
}

impl FilterPlugin for NodeAffinity {
    fn filter(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let Some(n) = node.node.as_ref() else {
            return Status::error("node not found");
        };
        let computed;
        let required = match state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) {
            Some(s) => &*s.0,
            // PreFilter disabled in the profile: compute it here, as upstream falls back.
            None => {
                computed = RequiredNodeAffinity::from_pod(pod);
                &computed
            }
        };
        match node_matches_pod(required, self.added_node_selector.as_ref(), n) {
            Ok(()) => Status::success(),
            Err(AffinityMismatch::Enforced) => Status::unresolvable(ERR_REASON_ENFORCED),
            Err(AffinityMismatch::Pod) => Status::unresolvable(ERR_REASON_POD),
        }
    }
}

impl PreScorePlugin for NodeAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        let preferred = match pod_preferred_terms(pod) {
            Ok(p) => p,
            Err(status) => return status,
        };
        if preferred.is_none() && self.added_preferred.is_none() {
            return Status::skip();
        }
        state.write(PRE_SCORE_STATE_KEY, PreScoreState(preferred.map(Arc::new)));
        Status::success()
    }
}

impl ScorePlugin for NodeAffinity {
    fn score(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        let Some(n) = node.node.as_ref() else {
            return Err(Status::error("node not found"));
        };
        let mut count = self.added_preferred.as_ref().map_or(0, |t| t.score(n));
        match state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) {
            Some(s) => count += s.0.as_ref().map_or(0, |t| t.score(n)),
            // PreScore disabled in the profile: parse here, as upstream falls back.
            None => count += pod_preferred_terms(pod)?.map_or(0, |t| t.score(n)),
        }
        Ok(count)
    }

    fn normalize(&self, _state: &CycleState, _pod: &Pod, scores: &mut [NodeScore]) -> Status {
        default_normalize_score(MAX_NODE_SCORE, false, scores);
        Status::success()
    }
}

#[cfg(test)]
#[path = "node_affinity_tests.rs"]
mod tests;
