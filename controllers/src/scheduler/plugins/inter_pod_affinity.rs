//! InterPodAffinity, as kube-scheduler v1.34's `interpodaffinity` plugin: PreFilter counts, per
//! topology pair, the existing Pods whose required anti-affinity matches the incoming Pod and the
//! existing Pods matching the incoming Pod's required affinity / anti-affinity terms; Filter then
//! only looks the node's topology values up in those counts (O(terms) per node). PreScore sums
//! the preferred terms of both sides (and existing Pods' required affinity, weighted by
//! `hardPodAffinityWeight`) per topology pair; Score reads the node's pairs; NormalizeScore scales
//! to 0..=100. `add_pod` / `remove_pod` keep the PreFilter counts right for preemption's
//! simulation.
//!
//! Owns only this plugin's cycle state and existing Pods' parsed terms, kept in their
//! [`PodInfo`] as upstream keeps them. A term's `namespaceSelector` is resolved against
//! [`Snapshot::namespace_labels`]; `matchLabelKeys` / `mismatchLabelKeys` are not read here because
//! the v1.34 API server merges them into the term's `labelSelector` when the Pod is created
//! (MatchLabelKeysInPodAffinity is GA and locked on).

use std::collections::{BTreeMap, HashMap, HashSet};

/// The hasher of this plugin's maps and sets: they are probed once per existing Pod per
/// scheduling cycle (every Pod of every node at 5,000 nodes), where SipHash's cost showed in
/// profiles (docs/BENCHMARKS.md, scheduler_perf's affinity workloads at 5,000 nodes). No key
/// comes from outside the cluster's own objects.
type Fast = foldhash::fast::RandomState;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, WeightedPodAffinityTerm};

use crate::helpers::selector::Selector;
use crate::scheduler::framework::runtime::parallel_fold;
use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, NodeScore, Plugin, PodInfo, PreFilterPlugin,
    PreFilterResult, PreScorePlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE,
};
use crate::scheduler::plugin_args::InterPodAffinityArgs;

/// The plugin's name in configurations and reasons.
pub const NAME: &str = "InterPodAffinity";

/// Filter reason when the node cannot satisfy the incoming Pod's required affinity
/// (UnschedulableAndUnresolvable: evicting Pods cannot create a matching Pod).
pub const ERR_REASON_AFFINITY_RULES_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
/// Filter reason when Pods matching the incoming Pod's required anti-affinity are in the node's
/// topology (Unschedulable: preemption may remove them).
pub const ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH: &str =
    "node(s) didn't match pod anti-affinity rules";
/// Filter reason when an existing Pod's required anti-affinity rejects the incoming Pod there.
pub const ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

const PRE_FILTER_STATE_KEY: &str = "PreFilterInterPodAffinity";
const PRE_SCORE_STATE_KEY: &str = "PreScoreInterPodAffinity";

/// The InterPodAffinity plugin.
pub struct InterPodAffinity {
    args: InterPodAffinityArgs,
    /// Threads PreFilter's and PreScore's passes over every node may use.
    workers: usize,
}

impl InterPodAffinity {
    /// Builds the plugin from its validated args; its passes over every node's Pods run on up
    /// to `workers` threads, as upstream's run on its parallelizer. The plugin reads no cluster
    /// objects besides the snapshot.
    pub fn new(args: InterPodAffinityArgs, workers: usize) -> Self {
        InterPodAffinity {
            args,
            workers: workers.max(1),
        }
    }

    /// The effective args.
    pub fn args(&self) -> &InterPodAffinityArgs {
        &self.args
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// The parsed terms of an existing Pod, kept in its [`PodInfo`] (parsed on first use).
fn terms_of(info: &PodInfo) -> Arc<PodTerms> {
    let any = info
        .affinity_terms
        .get_or_init(|| Arc::new(PodTerms::parse_lenient(&info.pod)));
    // Only this plugin sets the slot, always to PodTerms; parse again rather than fail if not.
    Arc::clone(any)
        .downcast::<PodTerms>()
        .unwrap_or_else(|_| Arc::new(PodTerms::parse_lenient(&info.pod)))
}

/// The namespaces a term names. Most terms name one (their own Pod's), and a term is matched
/// against every existing Pod in every cycle, so a short list compared in order costs less than
/// hashing each Pod's namespace; a namespaceSelector resolved over many namespaces becomes a set.
#[derive(Debug, Clone)]
enum Namespaces {
    List(Vec<String>),
    Set(HashSet<String, Fast>),
}

/// Past this many names, a term's namespaces are a set.
const NAMESPACE_LIST_MAX: usize = 8;

impl Namespaces {
    fn new(names: impl IntoIterator<Item = String>) -> Namespaces {
        let mut out = Namespaces::List(Vec::new());
        for n in names {
            out.insert(n);
        }
        out
    }

    fn contains(&self, ns: &str) -> bool {
        match self {
            Namespaces::List(v) => v.iter().any(|n| n == ns),
            Namespaces::Set(s) => s.contains(ns),
        }
    }

    fn insert(&mut self, ns: String) {
        match self {
            Namespaces::List(v) => {
                if !v.contains(&ns) {
                    v.push(ns);
                    if v.len() > NAMESPACE_LIST_MAX {
                        *self = Namespaces::Set(std::mem::take(v).into_iter().collect());
                    }
                }
            }
            Namespaces::Set(s) => {
                s.insert(ns);
            }
        }
    }
}

/// A parsed PodAffinityTerm (`framework.AffinityTerm`): a Pod matches when it is in one of
/// `namespaces` or its namespace's labels match `namespace_selector`, and its labels match
/// `selector`.
#[derive(Debug, Clone)]
pub(crate) struct AffinityTerm {
    namespaces: Namespaces,
    namespace_selector: Selector,
    selector: Selector,
    topology_key: String,
}

impl AffinityTerm {
    /// `newAffinityTerm`: no namespaces and no namespaceSelector means the owner's namespace.
    fn parse(owner: &Pod, term: &PodAffinityTerm, path: &str) -> Result<AffinityTerm, String> {
        let selector = Selector::parse(term.label_selector.as_ref())
            .map_err(|e| format!("{path}.labelSelector: {e}"))?;
        let namespace_selector = Selector::parse(term.namespace_selector.as_ref())
            .map_err(|e| format!("{path}.namespaceSelector: {e}"))?;
        let names = term.namespaces.as_deref().unwrap_or_default();
        let namespaces = if names.is_empty() && term.namespace_selector.is_none() {
            Namespaces::new([namespace_of(owner).to_string()])
        } else {
            Namespaces::new(names.iter().cloned())
        };
        Ok(AffinityTerm {
            namespaces,
            namespace_selector,
            selector,
            topology_key: term.topology_key.clone(),
        })
    }

    /// `AffinityTerm.Matches`: `ns_labels` are the labels of `pod`'s namespace (None for the
    /// incoming Pod's own terms, whose namespaceSelector was already resolved into names).
    fn matches(&self, pod: &Pod, ns_labels: Option<&BTreeMap<String, String>>) -> bool {
        (self.namespaces.contains(namespace_of(pod)) || self.namespace_selector.matches(ns_labels))
            && self.selector.matches(pod.metadata.labels.as_ref())
    }

    /// `mergeAffinityTermNamespacesIfNotEmpty`: a namespaceSelector with requirements becomes the
    /// names of the namespaces it selects now; an empty one (`{}`, every namespace) stays.
    fn merge_namespaces(&mut self, snapshot: &Snapshot) {
        if self.namespace_selector.is_everything() {
            return;
        }
        for (ns, labels) in &snapshot.namespace_labels {
            if self.namespace_selector.matches(Some(labels)) {
                self.namespaces.insert(ns.clone());
            }
        }
        self.namespace_selector = Selector::nothing();
    }
}

/// A parsed WeightedPodAffinityTerm.
#[derive(Debug, Clone)]
pub(crate) struct WeightedTerm {
    term: AffinityTerm,
    weight: i64,
}

/// A Pod's four kinds of pod (anti-)affinity terms, parsed (`framework.PodInfo`'s term fields).
#[derive(Debug, Clone, Default)]
pub(crate) struct PodTerms {
    required_affinity: Vec<AffinityTerm>,
    required_anti_affinity: Vec<AffinityTerm>,
    preferred_affinity: Vec<WeightedTerm>,
    preferred_anti_affinity: Vec<WeightedTerm>,
}

fn parse_terms(
    pod: &Pod,
    terms: Option<&Vec<PodAffinityTerm>>,
    path: &str,
) -> Result<Vec<AffinityTerm>, String> {
    terms
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| AffinityTerm::parse(pod, t, &format!("{path}[{i}]")))
        .collect()
}

fn parse_weighted(
    pod: &Pod,
    terms: Option<&Vec<WeightedPodAffinityTerm>>,
    path: &str,
) -> Result<Vec<WeightedTerm>, String> {
    terms
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| {
            Ok(WeightedTerm {
                term: AffinityTerm::parse(
                    pod,
                    &t.pod_affinity_term,
                    &format!("{path}[{i}].podAffinityTerm"),
                )?,
                weight: i64::from(t.weight),
            })
        })
        .collect()
}

impl PodTerms {
    /// Parses every term of the Pod; an invalid selector is an error naming its field.
    pub(crate) fn parse(pod: &Pod) -> Result<PodTerms, String> {
        let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return Ok(PodTerms::default());
        };
        let mut out = PodTerms::default();
        if let Some(a) = &affinity.pod_affinity {
            let p = "spec.affinity.podAffinity";
            out.required_affinity = parse_terms(
                pod,
                a.required_during_scheduling_ignored_during_execution
                    .as_ref(),
                &format!("{p}.requiredDuringSchedulingIgnoredDuringExecution"),
            )?;
            out.preferred_affinity = parse_weighted(
                pod,
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref(),
                &format!("{p}.preferredDuringSchedulingIgnoredDuringExecution"),
            )?;
        }
        if let Some(a) = &affinity.pod_anti_affinity {
            let p = "spec.affinity.podAntiAffinity";
            out.required_anti_affinity = parse_terms(
                pod,
                a.required_during_scheduling_ignored_during_execution
                    .as_ref(),
                &format!("{p}.requiredDuringSchedulingIgnoredDuringExecution"),
            )?;
            out.preferred_anti_affinity = parse_weighted(
                pod,
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref(),
                &format!("{p}.preferredDuringSchedulingIgnoredDuringExecution"),
            )?;
        }
        Ok(out)
    }

    /// The terms of an existing Pod: a kind of terms with an invalid selector is dropped (matches
    /// nothing), as upstream's PodInfo keeps no terms of a kind it could not parse.
    fn parse_lenient(pod: &Pod) -> PodTerms {
        let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return PodTerms::default();
        };
        let aff = affinity.pod_affinity.as_ref();
        let anti = affinity.pod_anti_affinity.as_ref();
        PodTerms {
            required_affinity: parse_terms(
                pod,
                aff.and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
                "",
            )
            .unwrap_or_default(),
            required_anti_affinity: parse_terms(
                pod,
                anti.and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
                "",
            )
            .unwrap_or_default(),
            preferred_affinity: parse_weighted(
                pod,
                aff.and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
                "",
            )
            .unwrap_or_default(),
            preferred_anti_affinity: parse_weighted(
                pod,
                anti.and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
                "",
            )
            .unwrap_or_default(),
        }
    }
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

fn node_labels(node: &NodeInfo) -> Option<&BTreeMap<String, String>> {
    node.node.as_ref().and_then(|n| n.metadata.labels.as_ref())
}

/// Counts per topology pair, as topology key -> value -> count (lookups by `&str`, no
/// allocation on the Filter path). Entries that drop to zero are removed, as upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TopologyCounts(HashMap<String, HashMap<String, i64, Fast>, Fast>);

impl TopologyCounts {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .get(key)
            .and_then(|m| m.get(value))
            .copied()
            .unwrap_or(0)
    }

    /// `topologyToMatchedTermCount.update`: adds `delta` to the node's pair for `key`, if the
    /// node has that label.
    fn update(&mut self, labels: Option<&BTreeMap<String, String>>, key: &str, delta: i64) {
        let Some(value) = labels.and_then(|l| l.get(key)) else {
            return;
        };
        // Look up before inserting: keys are only allocated for new pairs.
        if !self.0.contains_key(key) {
            self.0.insert(key.to_string(), HashMap::default());
        }
        let values = self.0.get_mut(key).expect("inserted above");
        match values.get_mut(value) {
            Some(c) => {
                *c += delta;
                if *c == 0 {
                    values.remove(value);
                    if values.is_empty() {
                        self.0.remove(key);
                    }
                }
            }
            None if delta != 0 => {
                values.insert(value.clone(), delta);
            }
            None => {}
        }
    }

    /// Adds another thread's counts (counts are only added in PreFilter, so no pair drops to
    /// zero here).
    fn merge(&mut self, other: TopologyCounts) {
        if self.0.is_empty() {
            *self = other;
            return;
        }
        for (key, values) in other.0 {
            let mine = self.0.entry(key).or_default();
            for (value, c) in values {
                *mine.entry(value).or_default() += c;
            }
        }
    }

    /// Each anti-affinity term that `pod` matches counts for the node's pair of its key.
    fn update_with_anti_affinity_terms(
        &mut self,
        terms: &[AffinityTerm],
        pod: &Pod,
        ns_labels: Option<&BTreeMap<String, String>>,
        labels: Option<&BTreeMap<String, String>>,
        delta: i64,
    ) {
        for t in terms {
            if t.matches(pod, ns_labels) {
                self.update(labels, &t.topology_key, delta);
            }
        }
    }

    /// When `pod` matches every affinity term, each term counts for the node's pair of its key.
    fn update_with_affinity_terms(
        &mut self,
        terms: &[AffinityTerm],
        pod: &Pod,
        labels: Option<&BTreeMap<String, String>>,
        delta: i64,
    ) {
        if pod_matches_all_affinity_terms(terms, pod) {
            for t in terms {
                self.update(labels, &t.topology_key, delta);
            }
        }
    }
}

/// True when there are terms and `pod` matches all of them (the incoming Pod's terms, whose
/// namespaceSelector is resolved, so no namespace labels are needed).
fn pod_matches_all_affinity_terms(terms: &[AffinityTerm], pod: &Pod) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, None))
}

/// What PreFilter computes for Filter.
#[derive(Debug, Clone)]
struct PreFilterState {
    /// Existing Pods' required anti-affinity terms that match the incoming Pod, per pair.
    existing_anti_affinity_counts: TopologyCounts,
    /// Existing Pods matching all of the incoming Pod's required affinity terms, per pair.
    affinity_counts: TopologyCounts,
    /// Existing Pods matching each of the incoming Pod's required anti-affinity terms, per pair.
    anti_affinity_counts: TopologyCounts,
    /// The incoming Pod's terms (namespaceSelector resolved); shared by preemption's clones.
    terms: Arc<PodTerms>,
    /// Whether the incoming Pod matches all its own required affinity terms.
    self_match: bool,
    /// The labels of the incoming Pod's namespace.
    namespace_labels: Option<Arc<BTreeMap<String, String>>>,
}

impl PreFilterState {
    fn update_with_pod(
        &mut self,
        incoming: &Pod,
        other: &Pod,
        other_terms: &PodTerms,
        node: &NodeInfo,
        delta: i64,
    ) {
        let labels = node_labels(node);
        let ns_labels = self.namespace_labels.as_deref();
        self.existing_anti_affinity_counts
            .update_with_anti_affinity_terms(
                &other_terms.required_anti_affinity,
                incoming,
                ns_labels,
                labels,
                delta,
            );
        self.affinity_counts.update_with_affinity_terms(
            &self.terms.required_affinity,
            other,
            labels,
            delta,
        );
        self.anti_affinity_counts.update_with_anti_affinity_terms(
            &self.terms.required_anti_affinity,
            other,
            None,
            labels,
            delta,
        );
    }
}

impl PreFilterPlugin for InterPodAffinity {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let mut terms = match PodTerms::parse(pod) {
            Ok(t) => t,
            Err(e) => {
                return (
                    None,
                    Status::unresolvable(format!("parsing pod: {e}")).with_plugin(NAME),
                )
            }
        };
        for t in terms
            .required_affinity
            .iter_mut()
            .chain(terms.required_anti_affinity.iter_mut())
        {
            t.merge_namespaces(snapshot);
        }
        let namespace_labels = snapshot
            .namespace_labels
            .get(namespace_of(pod))
            .cloned()
            .map(Arc::new);
        let ns_labels = namespace_labels.as_deref();

        // Existing Pods' required anti-affinity: only nodes that have such Pods.
        let with_anti = &snapshot.have_pods_with_required_anti_affinity;
        let mut existing = TopologyCounts::default();
        for part in parallel_fold(
            with_anti.len(),
            self.workers,
            TopologyCounts::default,
            |c, i| {
                let node = &snapshot.nodes[with_anti[i]];
                if node.node.is_none() {
                    return;
                }
                let labels = node_labels(node);
                for &p in &node.pods_with_required_anti_affinity {
                    let existing_terms = terms_of(&node.pods[p]);
                    c.update_with_anti_affinity_terms(
                        &existing_terms.required_anti_affinity,
                        pod,
                        ns_labels,
                        labels,
                        1,
                    );
                }
            },
        ) {
            existing.merge(part);
        }

        // The incoming Pod's required terms against every existing Pod.
        let mut affinity_counts = TopologyCounts::default();
        let mut anti_affinity_counts = TopologyCounts::default();
        if !terms.required_affinity.is_empty() || !terms.required_anti_affinity.is_empty() {
            let parts = parallel_fold(
                snapshot.nodes.len(),
                self.workers,
                <(TopologyCounts, TopologyCounts)>::default,
                |(aff, anti), i| {
                    let node = &snapshot.nodes[i];
                    if node.node.is_none() {
                        return;
                    }
                    let labels = node_labels(node);
                    for existing_pod in &node.pods {
                        aff.update_with_affinity_terms(
                            &terms.required_affinity,
                            &existing_pod.pod,
                            labels,
                            1,
                        );
                        anti.update_with_anti_affinity_terms(
                            &terms.required_anti_affinity,
                            &existing_pod.pod,
                            None,
                            labels,
                            1,
                        );
                    }
                },
            );
            for (aff, anti) in parts {
                affinity_counts.merge(aff);
                anti_affinity_counts.merge(anti);
            }
        }

        if existing.is_empty()
            && terms.required_affinity.is_empty()
            && terms.required_anti_affinity.is_empty()
        {
            return (None, Status::skip());
        }
        let self_match = pod_matches_all_affinity_terms(&terms.required_affinity, pod);
        state.write(
            PRE_FILTER_STATE_KEY,
            PreFilterState {
                existing_anti_affinity_counts: existing,
                affinity_counts,
                anti_affinity_counts,
                terms: Arc::new(terms),
                self_match,
                namespace_labels,
            },
        );
        (None, Status::success())
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        if let Some(s) = state.read_mut::<PreFilterState>(PRE_FILTER_STATE_KEY) {
            let terms = terms_of(added);
            s.update_with_pod(pod, &added.pod, &terms, node, 1);
        }
        Status::success()
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        if let Some(s) = state.read_mut::<PreFilterState>(PRE_FILTER_STATE_KEY) {
            let terms = terms_of(removed);
            s.update_with_pod(pod, &removed.pod, &terms, node, -1);
        }
        Status::success()
    }
}

/// The node has every topology key of the incoming Pod's required affinity terms, and Pods
/// matching them in each of its pairs, or no Pod anywhere matches and the Pod matches its own
/// terms (the first Pod of a group with affinity to itself).
fn satisfy_pod_affinity(s: &PreFilterState, labels: Option<&BTreeMap<String, String>>) -> bool {
    let mut pods_exist = true;
    for t in &s.terms.required_affinity {
        match labels.and_then(|l| l.get(&t.topology_key)) {
            Some(v) => {
                if s.affinity_counts.get(&t.topology_key, v) <= 0 {
                    pods_exist = false;
                }
            }
            None => return false,
        }
    }
    pods_exist || (s.affinity_counts.is_empty() && s.self_match)
}

fn satisfy_pod_anti_affinity(
    s: &PreFilterState,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    if s.anti_affinity_counts.is_empty() {
        return true;
    }
    !s.terms.required_anti_affinity.iter().any(|t| {
        labels
            .and_then(|l| l.get(&t.topology_key))
            .is_some_and(|v| s.anti_affinity_counts.get(&t.topology_key, v) > 0)
    })
}

fn satisfy_existing_pods_anti_affinity(
    s: &PreFilterState,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    // Upstream walks the node's labels; walking the (few) keys with counts is the same test.
    !s.existing_anti_affinity_counts
        .0
        .iter()
        .any(|(key, values)| {
            labels
                .and_then(|l| l.get(key))
                .and_then(|v| values.get(v))
                .is_some_and(|&c| c > 0)
        })
}

impl FilterPlugin for InterPodAffinity {
    fn filter(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) else {
            return Status::error(format!(
                "reading {PRE_FILTER_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME);
        };
        if node.node.is_none() {
            return Status::error("node not found").with_plugin(NAME);
        }
        let labels = node_labels(node);
        if !satisfy_pod_affinity(s, labels) {
            return Status::unresolvable(ERR_REASON_AFFINITY_RULES_NOT_MATCH).with_plugin(NAME);
        }
        if !satisfy_pod_anti_affinity(s, labels) {
            return Status::unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH)
                .with_plugin(NAME);
        }
        if !satisfy_existing_pods_anti_affinity(s, labels) {
            return Status::unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH)
                .with_plugin(NAME);
        }
        Status::success()
    }
}

/// Score per topology pair, as key -> value -> score.
type ScoreMap = HashMap<String, HashMap<String, i64, Fast>, Fast>;

#[derive(Debug, Clone)]
struct PreScoreState {
    topology_score: Arc<ScoreMap>,
}

fn process_term(
    m: &mut ScoreMap,
    term: &AffinityTerm,
    weight: i64,
    pod: &Pod,
    ns_labels: Option<&BTreeMap<String, String>>,
    node_labels: &BTreeMap<String, String>,
    multiplier: i64,
) {
    if term.matches(pod, ns_labels) {
        if let Some(v) = node_labels.get(&term.topology_key) {
            // Look up before inserting: keys are only allocated for new pairs.
            let delta = weight * multiplier;
            if let Some(c) = m.get_mut(&term.topology_key).and_then(|vs| vs.get_mut(v)) {
                *c += delta;
            } else {
                *m.entry(term.topology_key.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default() += delta;
            }
        }
    }
}

fn process_weighted(
    m: &mut ScoreMap,
    terms: &[WeightedTerm],
    pod: &Pod,
    ns_labels: Option<&BTreeMap<String, String>>,
    node_labels: &BTreeMap<String, String>,
    multiplier: i64,
) {
    for t in terms {
        process_term(
            m,
            &t.term,
            t.weight,
            pod,
            ns_labels,
            node_labels,
            multiplier,
        );
    }
}

impl InterPodAffinity {
    /// `processExistingPod`: both sides' preferred terms and the existing Pod's required
    /// affinity (weighted by hardPodAffinityWeight) for the existing Pod's node's pairs.
    fn process_existing_pod(
        &self,
        m: &mut ScoreMap,
        incoming_terms: &PodTerms,
        ns_labels: Option<&BTreeMap<String, String>>,
        existing: &PodInfo,
        node_labels: &BTreeMap<String, String>,
        incoming: &Pod,
    ) {
        if node_labels.is_empty() {
            return;
        }
        let existing_pod = &existing.pod;
        process_weighted(
            m,
            &incoming_terms.preferred_affinity,
            existing_pod,
            None,
            node_labels,
            1,
        );
        process_weighted(
            m,
            &incoming_terms.preferred_anti_affinity,
            existing_pod,
            None,
            node_labels,
            -1,
        );
        if !existing.has_affinity {
            return;
        }
        let existing_terms = terms_of(existing);
        if self.args.hard_pod_affinity_weight > 0 {
            let w = i64::from(self.args.hard_pod_affinity_weight);
            for t in &existing_terms.required_affinity {
                process_term(m, t, w, incoming, ns_labels, node_labels, 1);
            }
        }
        process_weighted(
            m,
            &existing_terms.preferred_affinity,
            incoming,
            ns_labels,
            node_labels,
            1,
        );
        process_weighted(
            m,
            &existing_terms.preferred_anti_affinity,
            incoming,
            ns_labels,
            node_labels,
            -1,
        );
    }
}

/// Adds another thread's scores per pair. Unlike the PreFilter counts, a pair whose sum is zero
/// stays, as upstream's map keeps it (Score reads it as 0 either way).
fn merge_scores(m: &mut ScoreMap, other: ScoreMap) {
    if m.is_empty() {
        *m = other;
        return;
    }
    for (key, values) in other {
        let mine = m.entry(key).or_default();
        for (value, c) in values {
            *mine.entry(value).or_default() += c;
        }
    }
}

fn has_preferred(pod: &Pod) -> bool {
    let Some(a) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
        return false;
    };
    let aff = a.pod_affinity.as_ref().is_some_and(|p| {
        !p.preferred_during_scheduling_ignored_during_execution
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    });
    let anti = a.pod_anti_affinity.as_ref().is_some_and(|p| {
        !p.preferred_during_scheduling_ignored_during_execution
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    });
    aff || anti
}

impl PreScorePlugin for InterPodAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        if nodes.is_empty() {
            return Status::skip();
        }
        let has_constraints = has_preferred(pod);
        if self.args.ignore_preferred_terms_of_existing_pods && !has_constraints {
            return Status::skip();
        }
        let mut terms = match PodTerms::parse(pod) {
            Ok(t) => t,
            Err(e) => return Status::error(format!("failed to parse pod: {e}")).with_plugin(NAME),
        };
        for t in terms
            .preferred_affinity
            .iter_mut()
            .chain(terms.preferred_anti_affinity.iter_mut())
        {
            t.term.merge_namespaces(snapshot);
        }
        let ns_labels = snapshot.namespace_labels.get(namespace_of(pod));

        let visit =
            |m: &mut ScoreMap, node: &NodeInfo, pods: &mut dyn Iterator<Item = &PodInfo>| {
                let Some(labels) = node_labels(node) else {
                    return;
                };
                for existing in pods {
                    self.process_existing_pod(m, &terms, ns_labels, existing, labels, pod);
                }
            };
        let parts = if has_constraints {
            parallel_fold(
                snapshot.nodes.len(),
                self.workers,
                ScoreMap::default,
                |m, i| {
                    let node = &snapshot.nodes[i];
                    visit(m, node, &mut node.pods.iter());
                },
            )
        } else {
            let with_affinity = &snapshot.have_pods_with_affinity;
            parallel_fold(
                with_affinity.len(),
                self.workers,
                ScoreMap::default,
                |m, i| {
                    let node = &snapshot.nodes[with_affinity[i]];
                    visit(
                        m,
                        node,
                        &mut node.pods_with_affinity.iter().map(|&p| &node.pods[p]),
                    );
                },
            )
        };
        let mut score = ScoreMap::default();
        for part in parts {
            merge_scores(&mut score, part);
        }
        if score.is_empty() {
            return Status::skip();
        }
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                topology_score: Arc::new(score),
            },
        );
        Status::success()
    }
}

impl ScorePlugin for InterPodAffinity {
    fn score(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Err(Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME));
        };
        let Some(labels) = node_labels(node) else {
            return Ok(0);
        };
        Ok(s.topology_score
            .iter()
            .filter_map(|(key, values)| labels.get(key).and_then(|v| values.get(v)))
            .sum())
    }

    fn normalize(&self, state: &CycleState, _pod: &Pod, scores: &mut [NodeScore]) -> Status {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME);
        };
        if s.topology_score.is_empty() {
            return Status::success();
        }
        let max = scores.iter().map(|s| s.score).max().unwrap_or(0);
        let min = scores.iter().map(|s| s.score).min().unwrap_or(0);
        let diff = max - min;
        for s in scores.iter_mut() {
            s.score = if diff > 0 {
                (MAX_NODE_SCORE as f64 * ((s.score - min) as f64 / diff as f64)) as i64
            } else {
                0
            };
        }
        Status::success()
    }
}

#[cfg(test)]
#[path = "inter_pod_affinity_tests.rs"]
mod tests;
