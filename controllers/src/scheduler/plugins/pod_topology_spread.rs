//! PodTopologySpread, as kube-scheduler v1.34's `podtopologyspread` plugin.
//!
//! PreFilter counts, for each `DoNotSchedule` constraint, the matching Pods per topology value
//! over the nodes that carry every constraint's key and pass the constraint's node inclusion
//! policies (nodeAffinityPolicy Honor by default, nodeTaintsPolicy Ignore by default), and keeps
//! the two smallest counts ("critical paths"); Filter is then O(constraints) per node: the node's
//! count + 1 (if the Pod matches its own selector) - the global minimum (0 when fewer than
//! minDomains domains exist) must not exceed maxSkew. PreScore / Score / NormalizeScore do the
//! same for `ScheduleAnyway` constraints, weighting each constraint by log(domains + 2).
//!
//! A Pod without constraints gets the plugin's default constraints (`defaultingType: System`:
//! hostname maxSkew 3 and zone maxSkew 5, both ScheduleAnyway) with a selector built from the
//! Services, ReplicationController, ReplicaSet or StatefulSet that select or own it.
//!
//! Owns only this plugin's cycle state and a memo of per-node match counts (recounted only for
//! nodes that changed since the previous cycle with the same selector; upstream recounts every
//! node in every cycle, in parallel). v1.34 specifics: minDomains and the node inclusion
//! policies are GA (always on); `matchLabelKeys` values are merged into the selector here even
//! though the v1.34 API server already merges them (MatchLabelKeysInPodTopologySpreadSelectorMerge,
//! beta, on): merging twice selects the same Pods, and Pods created before the merge still work.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use k8s_openapi::api::core::v1::{Node, Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::helpers::nodeaffinity::RequiredNodeAffinity;
use crate::helpers::selector::Selector;
use crate::helpers::taints::{
    find_untolerated_taint, is_do_not_schedule_taint, node_taints, pod_tolerations,
};
use crate::scheduler::framework::{
    ClusterObjects, CycleState, FilterPlugin, NodeInfo, NodeScore, Plugin, PodInfo,
    PreFilterPlugin, PreFilterResult, PreScorePlugin, ScorePlugin, Snapshot, Status,
    MAX_NODE_SCORE,
};
use crate::scheduler::plugin_args::{
    DefaultingType, PodTopologySpreadArgs, DO_NOT_SCHEDULE, SCHEDULE_ANYWAY,
};

/// The plugin's name in configurations and reasons.
pub const NAME: &str = "PodTopologySpread";

/// Filter reason when the skew would exceed maxSkew (Unschedulable).
pub const ERR_REASON_CONSTRAINTS_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints";
/// Filter reason when the node lacks a constraint's topology key (UnschedulableAndUnresolvable).
pub const ERR_REASON_NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const PRE_FILTER_STATE_KEY: &str = "PreFilterPodTopologySpread";
const PRE_SCORE_STATE_KEY: &str = "PreScorePodTopologySpread";

const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
const HONOR: &str = "Honor";
const IGNORE: &str = "Ignore";

fn system_default_constraints() -> Vec<TopologySpreadConstraint> {
    vec![
        TopologySpreadConstraint {
            topology_key: LABEL_HOSTNAME.to_string(),
            when_unsatisfiable: SCHEDULE_ANYWAY.to_string(),
            max_skew: 3,
            ..Default::default()
        },
        TopologySpreadConstraint {
            topology_key: LABEL_TOPOLOGY_ZONE.to_string(),
            when_unsatisfiable: SCHEDULE_ANYWAY.to_string(),
            max_skew: 5,
            ..Default::default()
        },
    ]
}

/// The PodTopologySpread plugin.
pub struct PodTopologySpread {
    default_constraints: Vec<TopologySpreadConstraint>,
    system_defaulted: bool,
    objects: Arc<dyn ClusterObjects>,
    memo: CountMemo,
    domains: DomainMemo,
}

impl PodTopologySpread {
    /// Builds the plugin from its validated args; `objects` provides the Services and owners
    /// the default constraints' selectors are built from.
    pub fn new(args: PodTopologySpreadArgs, objects: Arc<dyn ClusterObjects>) -> Self {
        let system_defaulted = args.defaulting_type == DefaultingType::System;
        let default_constraints = if system_defaulted {
            system_default_constraints()
        } else {
            args.default_constraints
        };
        PodTopologySpread {
            default_constraints,
            system_defaulted,
            objects,
            memo: CountMemo::default(),
            domains: DomainMemo::default(),
        }
    }
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// A conjunction of label selectors (a selector with requirements added, as `labels.Selector`'s
/// `Add`): the constraint's own selector, the `matchLabelKeys` pairs, or the default selector's
/// parts.
#[derive(Debug, Clone)]
struct PodSelector(Vec<Selector>);

impl PodSelector {
    fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.0.iter().all(|s| s.matches(labels))
    }

    /// No requirement at all (`selector.Empty()`).
    fn is_empty(&self) -> bool {
        self.0.iter().all(|s| s.is_everything())
    }
}

/// `topologySpreadConstraint`: the parsed constraint.
#[derive(Debug, Clone)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    selector: PodSelector,
    min_domains: usize,
    honor_node_affinity: bool,
    honor_node_taints: bool,
}

impl Constraint {
    /// `matchNodeInclusionPolicies`.
    fn includes_node(&self, pod: &Pod, node: &Node, required: &RequiredNodeAffinity) -> bool {
        if self.honor_node_affinity && !required.matches(node) {
            return false;
        }
        if self.honor_node_taints
            && find_untolerated_taint(
                node_taints(node),
                pod_tolerations(pod),
                is_do_not_schedule_taint,
            )
            .is_some()
        {
            return false;
        }
        true
    }
}

fn pod_labels(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.labels.as_ref()
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

fn node_labels(node: &Node) -> Option<&BTreeMap<String, String>> {
    node.metadata.labels.as_ref()
}

fn node_has_all_keys(node: &Node, constraints: &[Constraint]) -> bool {
    let labels = node_labels(node);
    constraints
        .iter()
        .all(|c| labels.is_some_and(|l| l.contains_key(&c.topology_key)))
}

/// `filterTopologySpreadConstraints`: the constraints with this `whenUnsatisfiable`, parsed.
fn filter_constraints(
    constraints: &[TopologySpreadConstraint],
    pod: &Pod,
    action: &str,
    path: &str,
) -> Result<Vec<Constraint>, String> {
    let mut out = Vec::new();
    for (i, c) in constraints.iter().enumerate() {
        if c.when_unsatisfiable != action {
            continue;
        }
        let field = format!("{path}[{i}]");
        let mut parts = vec![Selector::parse(c.label_selector.as_ref())
            .map_err(|e| format!("{field}.labelSelector: {e}"))?];
        let keys = c.match_label_keys.as_deref().unwrap_or_default();
        if !keys.is_empty() {
            let labels = pod_labels(pod);
            let pairs: BTreeMap<String, String> = keys
                .iter()
                .filter_map(|k| Some((k.clone(), labels?.get(k)?.clone())))
                .collect();
            if !pairs.is_empty() {
                parts.push(Selector::from_labels(&pairs));
            }
        }
        let policy = |v: Option<&String>, default_honor: bool, name: &str| {
            match v.map(|s| s.as_str()) {
            None => Ok(default_honor),
            Some(HONOR) => Ok(true),
            Some(IGNORE) => Ok(false),
            Some(other) => Err(format!(
                "{field}.{name}: Unsupported value: {other:?}: supported values: \"Honor\", \"Ignore\""
            )),
        }
        };
        out.push(Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector: PodSelector(parts),
            min_domains: c.min_domains.map_or(1, |m| m.max(0) as usize),
            honor_node_affinity: policy(
                c.node_affinity_policy.as_ref(),
                true,
                "nodeAffinityPolicy",
            )?,
            honor_node_taints: policy(c.node_taints_policy.as_ref(), false, "nodeTaintsPolicy")?,
        });
    }
    Ok(out)
}

/// What a plugin remembers between cycles per key, at most `CAP` keys (past that it starts
/// over). A cycle takes a key's value out and puts it back when done, so the lock is held only
/// for the exchange, never while the value is used.
#[derive(Default)]
struct Memo<T, const CAP: usize>(Mutex<HashMap<String, T>>);

impl<T: Default, const CAP: usize> Memo<T, CAP> {
    fn take(&self, key: &str) -> T {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(key).unwrap_or_default()
    }

    fn put(&self, key: String, value: T) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAP {
            map.clear();
        }
        map.insert(key, value);
    }
}

/// Per (namespace, selector): each snapshot position's node object and its matching-Pod count,
/// so that a cycle only counts the Pods of nodes that changed since the previous cycle with the
/// same selector (typically the Pods of one workload, scheduled one after another). A node in a
/// snapshot is immutable behind its `Arc`; the weak reference proves the remembered count belongs
/// to that very object (its allocation cannot be reused while the weak reference lives, and
/// `Arc::make_mut` moves a value away from weak references). At most 64 selectors.
type CountMemo = Memo<Vec<NodeCount>, 64>;

/// A node object (by weak reference) and its matching-Pod count.
type NodeCount = (Weak<NodeInfo>, i64);

/// The distinct [`CountMemo`] keys of the constraints and, per constraint, the index of its key
/// (constraints with the same selector share one memo).
fn count_memo_keys(constraints: &[Constraint], ns: &str) -> (Vec<String>, Vec<usize>) {
    let mut keys: Vec<String> = Vec::new();
    let slot = constraints
        .iter()
        .map(|c| {
            let k = format!("{ns}\u{0}{:?}", c.selector.0);
            keys.iter().position(|x| *x == k).unwrap_or_else(|| {
                keys.push(k);
                keys.len() - 1
            })
        })
        .collect();
    (keys, slot)
}

/// The matching-Pod count of the node at snapshot position `i`, from `memo` when it was counted
/// for this very node object.
fn memo_count(
    memo: &mut Vec<NodeCount>,
    i: usize,
    node: &Arc<NodeInfo>,
    selector: &PodSelector,
    ns: &str,
) -> i64 {
    if memo.len() <= i {
        memo.resize(i + 1, (Weak::new(), 0));
    }
    let (weak, count) = &memo[i];
    if std::ptr::eq(weak.as_ptr(), Arc::as_ptr(node)) {
        return *count;
    }
    let count = count_matching(&node.pods, selector, ns);
    memo[i] = (Arc::downgrade(node), count);
    count
}

/// Per topology key: each snapshot position's Node object and its domain (the key's value,
/// interned), so that a cycle reads the labels only of Nodes that changed since the previous
/// cycle, and sums per domain in a vector instead of hashing every node's value. The same weak
/// reference argument as [`CountMemo`] makes a remembered domain belong to that very object.
/// At most 16 topology keys.
type DomainMemo = Memo<Domains, 16>;

#[derive(Default)]
struct Domains {
    nodes: Vec<(Weak<Node>, Option<u32>)>,
    values: Vec<String>,
    index: HashMap<String, u32>,
}

impl Domains {
    /// These domains, or none when they hold many more values than a snapshot of `nodes` could
    /// use: values of Nodes long gone (e.g. hostnames) are forgotten now and then.
    fn pruned(self, nodes: usize) -> Domains {
        if self.values.len() > 2 * nodes + 64 {
            Domains::default()
        } else {
            self
        }
    }

    /// The domain of the Node at snapshot position `pos` for `key`; None when it lacks the label.
    fn of(&mut self, pos: usize, node: &Arc<Node>, key: &str) -> Option<u32> {
        if self.nodes.len() <= pos {
            self.nodes.resize(pos + 1, (Weak::new(), None));
        }
        let (weak, domain) = &self.nodes[pos];
        if std::ptr::eq(weak.as_ptr(), Arc::as_ptr(node)) {
            return *domain;
        }
        let domain =
            node_labels(node)
                .and_then(|l| l.get(key))
                .map(|value| match self.index.get(value) {
                    Some(&d) => d,
                    None => {
                        let d = self.values.len() as u32;
                        self.values.push(value.clone());
                        self.index.insert(value.clone(), d);
                        d
                    }
                });
        self.nodes[pos] = (Arc::downgrade(node), domain);
        domain
    }
}

/// Counts the Pods of `pods` in `ns`, not terminating, matching the selector
/// (`countPodsMatchSelector`).
fn count_matching(pods: &[PodInfo], selector: &PodSelector, ns: &str) -> i64 {
    pods.iter()
        .filter(|p| {
            p.pod.metadata.deletion_timestamp.is_none()
                && namespace_of(&p.pod) == ns
                && selector.matches(pod_labels(&p.pod))
        })
        .count() as i64
}

impl PodTopologySpread {
    /// The Pod's own constraints for `action`, or the default constraints when it has none.
    fn constraints(&self, pod: &Pod, action: &str) -> Result<Vec<Constraint>, String> {
        let own = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_deref())
            .unwrap_or_default();
        if !own.is_empty() {
            return filter_constraints(own, pod, action, "spec.topologySpreadConstraints");
        }
        self.build_default_constraints(pod, action)
    }

    /// `buildDefaultConstraints`: the default constraints with the selector deduced from the
    /// Pod's Services and controller; none when that selector is empty.
    fn build_default_constraints(
        &self,
        pod: &Pod,
        action: &str,
    ) -> Result<Vec<Constraint>, String> {
        let mut constraints =
            filter_constraints(&self.default_constraints, pod, action, "defaultConstraints")?;
        if constraints.is_empty() {
            return Ok(constraints);
        }
        let selector = self.default_selector(pod);
        if selector.is_empty() {
            return Ok(Vec::new());
        }
        for c in &mut constraints {
            c.selector = selector.clone();
        }
        Ok(constraints)
    }

    /// `helper.DefaultSelector`: the union of the selecting Services' selectors, plus the
    /// selector of the ReplicationController / ReplicaSet / StatefulSet controlling the Pod.
    fn default_selector(&self, pod: &Pod) -> PodSelector {
        let ns = namespace_of(pod);
        let labels = pod_labels(pod);
        let mut set: BTreeMap<String, String> = BTreeMap::new();
        for svc in self.objects.services(ns) {
            let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                continue;
            };
            if Selector::from_labels(sel).matches(labels) {
                set.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let mut parts = vec![Selector::from_labels(&set)];
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true));
        if let Some(owner) = owner {
            let named = |name: Option<&String>| name == Some(&owner.name);
            match (owner.api_version.as_str(), owner.kind.as_str()) {
                ("v1", "ReplicationController") => {
                    let rcs = self.objects.replication_controllers(ns);
                    if let Some(rc) = rcs.iter().find(|rc| named(rc.metadata.name.as_ref())) {
                        if let Some(sel) = rc.spec.as_ref().and_then(|s| s.selector.as_ref()) {
                            set.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
                        }
                        parts = vec![Selector::from_labels(&set)];
                    }
                }
                ("apps/v1", "ReplicaSet") => {
                    let rss = self.objects.replica_sets(ns);
                    if let Some(rs) = rss.iter().find(|rs| named(rs.metadata.name.as_ref())) {
                        add_selector(&mut parts, rs.spec.as_ref().map(|s| &s.selector));
                    }
                }
                ("apps/v1", "StatefulSet") => {
                    let sss = self.objects.stateful_sets(ns);
                    if let Some(ss) = sss.iter().find(|ss| named(ss.metadata.name.as_ref())) {
                        add_selector(&mut parts, ss.spec.as_ref().map(|s| &s.selector));
                    }
                }
                _ => {}
            }
        }
        PodSelector(parts)
    }
}

/// Adds a controller's selector requirements (a nil or invalid selector adds none).
fn add_selector(parts: &mut Vec<Selector>, sel: Option<&LabelSelector>) {
    if let Some(sel) = sel {
        if let Ok(s) = Selector::parse(Some(sel)) {
            parts.push(s);
        }
    }
}

/// The two smallest match counts of a constraint (`criticalPaths`): `[0]` always holds the
/// minimum; `[1]` is at least `[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CriticalPaths([(String, i64); 2]);

impl CriticalPaths {
    fn new() -> Self {
        CriticalPaths([
            (String::new(), i64::from(i32::MAX)),
            (String::new(), i64::from(i32::MAX)),
        ])
    }

    fn update(&mut self, value: &str, num: i64) {
        let p = &mut self.0;
        let i = if value == p[0].0 {
            Some(0)
        } else if value == p[1].0 {
            Some(1)
        } else {
            None
        };
        match i {
            Some(i) => {
                p[i].1 = num;
                if p[0].1 > p[1].1 {
                    p.swap(0, 1);
                }
            }
            None => {
                if num < p[0].1 {
                    p[1] = p[0].clone();
                    p[0] = (value.to_string(), num);
                } else if num < p[1].1 {
                    p[1] = (value.to_string(), num);
                }
            }
        }
    }
}

/// What PreFilter computes for Filter.
#[derive(Debug, Clone)]
struct PreFilterState {
    constraints: Arc<Vec<Constraint>>,
    /// Per constraint: whether the incoming Pod matches its selector.
    self_match: Arc<Vec<bool>>,
    critical_paths: Vec<CriticalPaths>,
    /// Per constraint: topology value -> matching Pods.
    tp_value_to_match_num: Vec<HashMap<String, i64>>,
    /// The incoming Pod's required node affinity (for add_pod / remove_pod).
    required: Arc<RequiredNodeAffinity>,
}

impl PreFilterState {
    /// `minMatchNum`: the global minimum, 0 when fewer than minDomains domains exist.
    fn min_match_num(&self, i: usize, min_domains: usize) -> i64 {
        if self.tp_value_to_match_num[i].len() < min_domains {
            0
        } else {
            self.critical_paths[i].0[0].1
        }
    }

    /// `updateWithPod`: preemption's simulation of `other` added / removed on `node`.
    fn update_with_pod(&mut self, other: &Pod, incoming: &Pod, node: &NodeInfo, delta: i64) {
        let Some(node) = node.node.as_deref() else {
            return;
        };
        if namespace_of(other) != namespace_of(incoming)
            || !node_has_all_keys(node, &self.constraints)
        {
            return;
        }
        let labels = pod_labels(other);
        for (i, c) in self.constraints.iter().enumerate() {
            if !c.selector.matches(labels) || !c.includes_node(incoming, node, &self.required) {
                continue;
            }
            let v = node_labels(node)
                .and_then(|l| l.get(&c.topology_key))
                .cloned()
                .unwrap_or_default();
            let n = self.tp_value_to_match_num[i].entry(v.clone()).or_default();
            *n += delta;
            let n = *n;
            self.critical_paths[i].update(&v, n);
        }
    }
}

impl PreFilterPlugin for PodTopologySpread {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let constraints = match self.constraints(pod, DO_NOT_SCHEDULE) {
            Ok(c) => c,
            Err(e) => {
                return (
                    None,
                    Status::error(format!("get constraints from pod: {e}")).with_plugin(NAME),
                )
            }
        };
        if constraints.is_empty() {
            return (None, Status::skip());
        }
        let required = RequiredNodeAffinity::from_pod(pod);
        let ns = namespace_of(pod);
        let (keys, slot) = count_memo_keys(&constraints, ns);
        let mut memos: Vec<_> = keys.iter().map(|k| self.memo.take(k)).collect();
        // Per constraint: its key's domains (a second constraint on the same key, which
        // validation forbids, would start from an empty memo: slower, not wrong), and per domain
        // the matching Pods and whether any node of it counts.
        let n = snapshot.nodes.len();
        let mut domains: Vec<Domains> = constraints
            .iter()
            .map(|c| self.domains.take(&c.topology_key).pruned(n))
            .collect();
        let mut sums: Vec<Vec<(i64, bool)>> = vec![Vec::new(); constraints.len()];
        let mut node_domains: Vec<u32> = vec![0; constraints.len()];
        'nodes: for (pos, info) in snapshot.nodes.iter().enumerate() {
            let Some(node) = info.node.as_ref() else {
                continue;
            };
            // `nodeHasAllKeys`: a node without every constraint's key counts for none.
            for (i, c) in constraints.iter().enumerate() {
                match domains[i].of(pos, node, &c.topology_key) {
                    Some(d) => node_domains[i] = d,
                    None => continue 'nodes,
                }
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes_node(pod, node, &required) {
                    continue;
                }
                let count = memo_count(&mut memos[slot[i]], pos, info, &c.selector, ns);
                let d = node_domains[i] as usize;
                if sums[i].len() <= d {
                    sums[i].resize(d + 1, (0, false));
                }
                sums[i][d].0 += count;
                sums[i][d].1 = true;
            }
        }
        let counts: Vec<HashMap<String, i64>> = sums
            .iter()
            .zip(&domains)
            .map(|(sum, dom)| {
                sum.iter()
                    .enumerate()
                    .filter(|(_, (_, seen))| *seen)
                    .map(|(d, (count, _))| (dom.values[d].clone(), *count))
                    .collect()
            })
            .collect();
        for (k, m) in keys.into_iter().zip(memos) {
            self.memo.put(k, m);
        }
        for (c, d) in constraints.iter().zip(domains) {
            self.domains.put(c.topology_key.clone(), d);
        }
        let critical_paths = counts
            .iter()
            .map(|m| {
                let mut p = CriticalPaths::new();
                for (v, &n) in m {
                    p.update(v, n);
                }
                p
            })
            .collect();
        let self_match = constraints
            .iter()
            .map(|c| c.selector.matches(pod_labels(pod)))
            .collect();
        state.write(
            PRE_FILTER_STATE_KEY,
            PreFilterState {
                constraints: Arc::new(constraints),
                self_match: Arc::new(self_match),
                critical_paths,
                tp_value_to_match_num: counts,
                required: Arc::new(required),
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
            s.update_with_pod(&added.pod, pod, node, 1);
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
            s.update_with_pod(&removed.pod, pod, node, -1);
        }
        Status::success()
    }
}

impl FilterPlugin for PodTopologySpread {
    fn filter(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) else {
            return Status::error(format!(
                "reading {PRE_FILTER_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME);
        };
        let labels = node.node.as_deref().and_then(node_labels);
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = labels.and_then(|l| l.get(&c.topology_key)) else {
                return Status::unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH).with_plugin(NAME);
            };
            let min = s.min_match_num(i, c.min_domains);
            let self_match = i64::from(s.self_match[i]);
            let matched = s.tp_value_to_match_num[i].get(value).copied().unwrap_or(0);
            if matched + self_match - min > c.max_skew {
                return Status::unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH).with_plugin(NAME);
            }
        }
        Status::success()
    }
}

/// What PreScore computes for Score.
#[derive(Debug, Clone)]
struct PreScoreState {
    constraints: Arc<Vec<Constraint>>,
    /// Feasible nodes missing some constraint's key (scored 0, then normalized to 0).
    ignored_nodes: Arc<HashSet<String>>,
    /// Per constraint (hostname constraints excluded: counted per node in Score): topology
    /// value -> matching Pods, for the values of the feasible nodes.
    tp_value_to_pod_counts: Arc<Vec<HashMap<String, i64>>>,
    /// Per constraint: log(number of domains + 2).
    weights: Arc<Vec<f64>>,
    /// The incoming Pod's namespace.
    namespace: String,
}

impl PreScorePlugin for PodTopologySpread {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        if snapshot.nodes.is_empty() {
            return Status::skip();
        }
        let has_own = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_deref())
            .is_some_and(|c| !c.is_empty());
        // Only non-system-default constraints need every key on a node: nodes without a zone
        // label still spread by hostname under the system defaults.
        let require_all = has_own || !self.system_defaulted;
        let constraints = match self.constraints(pod, SCHEDULE_ANYWAY) {
            Ok(c) => c,
            Err(e) => {
                return Status::error(format!("calculating preScoreState: {e}")).with_plugin(NAME)
            }
        };
        if constraints.is_empty() {
            return Status::skip();
        }
        let mut ignored = HashSet::new();
        let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); constraints.len()];
        for info in nodes {
            let Some(node) = info.node.as_deref() else {
                continue;
            };
            if require_all && !node_has_all_keys(node, &constraints) {
                ignored.insert(info.name().to_string());
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == LABEL_HOSTNAME {
                    continue;
                }
                let value = node_labels(node)
                    .and_then(|l| l.get(&c.topology_key))
                    .cloned()
                    .unwrap_or_default();
                counts[i].entry(value).or_insert(0);
            }
        }
        let weights = constraints
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let size = if c.topology_key == LABEL_HOSTNAME {
                    nodes.len() - ignored.len()
                } else {
                    counts[i].len()
                };
                ((size + 2) as f64).ln()
            })
            .collect();

        let required = RequiredNodeAffinity::from_pod(pod);
        let ns = namespace_of(pod);
        let (keys, slot) = count_memo_keys(&constraints, ns);
        let mut memos: Vec<_> = keys.iter().map(|k| self.memo.take(k)).collect();
        for (pos, info) in snapshot.nodes.iter().enumerate() {
            let Some(node) = info.node.as_deref() else {
                continue;
            };
            if require_all && !node_has_all_keys(node, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes_node(pod, node, &required) {
                    continue;
                }
                let value = node_labels(node)
                    .and_then(|l| l.get(&c.topology_key))
                    .map(String::as_str)
                    .unwrap_or_default();
                if let Some(n) = counts[i].get_mut(value) {
                    *n += memo_count(&mut memos[slot[i]], pos, info, &c.selector, ns);
                }
            }
        }
        for (k, m) in keys.into_iter().zip(memos) {
            self.memo.put(k, m);
        }
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                constraints: Arc::new(constraints),
                ignored_nodes: Arc::new(ignored),
                tp_value_to_pod_counts: Arc::new(counts),
                weights: Arc::new(weights),
                namespace: ns.to_string(),
            },
        );
        Status::success()
    }
}

impl ScorePlugin for PodTopologySpread {
    fn score(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Err(Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME));
        };
        if s.ignored_nodes.contains(node.name()) {
            return Ok(0);
        }
        let labels = node.node.as_deref().and_then(node_labels);
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = labels.and_then(|l| l.get(&c.topology_key)) else {
                continue;
            };
            let cnt = if c.topology_key == LABEL_HOSTNAME {
                count_matching(&node.pods, &c.selector, &s.namespace)
            } else {
                s.tp_value_to_pod_counts[i].get(value).copied().unwrap_or(0)
            };
            // `scoreForCount`: maxSkew-1 waters down differences between domains.
            score += cnt as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        Ok(score.round() as i64)
    }

    fn normalize(&self, state: &CycleState, _pod: &Pod, scores: &mut [NodeScore]) -> Status {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"
            ))
            .with_plugin(NAME);
        };
        let mut min = i64::MAX;
        let mut max = 0;
        let mut ignored = vec![false; scores.len()];
        for (i, sc) in scores.iter().enumerate() {
            if s.ignored_nodes.contains(&sc.name) {
                ignored[i] = true;
                continue;
            }
            min = min.min(sc.score);
            max = max.max(sc.score);
        }
        for (i, sc) in scores.iter_mut().enumerate() {
            sc.score = if ignored[i] {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - sc.score) / max
            };
        }
        Status::success()
    }
}

#[cfg(test)]
#[path = "pod_topology_spread_tests.rs"]
mod tests;
