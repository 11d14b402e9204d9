//! The DaemonSet plan: from a DaemonSet, the Nodes and the DaemonSet's Pods in the caches, what one
//! sync does, as kube-controller-manager v1.34.4's `pkg/controller/daemon` decides it: which nodes
//! should run a daemon Pod (`NodeShouldRunDaemonPod`, with the tolerations the controller adds
//! itself), the Pod a creation posts (`CreatePodTemplate` plus the `metadata.name` node affinity of
//! `ReplaceDaemonSetPodNodeNameNodeAffinity`), `manage` / `podsShouldBeOnNode` (DS-4, DS-5),
//! `rollingUpdate` with maxUnavailable and with maxSurge (DS-7), the status counts (DS-9) and the
//! ControllerRevision history decisions (DS-3: current and old revisions, dedup, cleanup).
//!
//! Pure functions over API objects and a caller-given clock; nothing here reads a cache or calls
//! the API server (that is `super`). Node affinity and taint matching are the scheduler's own
//! ([`crate::helpers::nodeaffinity`], [`crate::helpers::taints`]), so a node the controller finds eligible is one the
//! scheduler accepts on those grounds.
//!
//! Where older descriptions and v1.34 differ, v1.34 is followed: DS-5 as first written pins daemon
//! Pods with a `kubernetes.io/hostname` In [node] label term; v1.34 uses a `matchFields` term on
//! `metadata.name` (labels can lie, the name cannot), and DS-7's "maxUnavailable is the only
//! parameter" predates maxSurge, which v1.34 implements (GA since v1.25).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::helpers::nodeaffinity::{self, RequiredNodeAffinity};
use crate::helpers::selector::Selector;
use crate::helpers::taints;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::claim::OwnerInfo;
use crate::runtime::pod_control;
use crate::runtime::pods;

/// Creations or deletions one sync may issue (upstream's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 250;

/// The label naming the ControllerRevision a Pod was made from (`apps.DefaultDaemonSetUniqueLabelKey`).
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The label carrying the template generation a Pod was made from (kept for Pods created before
/// ControllerRevisions; `extensions.DaemonSetTemplateGenerationKey`).
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The annotation the API server keeps the template generation in (`apps.DeprecatedTemplateGeneration`).
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// The only field a node selector's `matchFields` can name.
const OBJECT_NAME_FIELD: &str = nodeaffinity::OBJECT_NAME_FIELD;

/// Event reason: the selector selects every Pod.
pub const SELECTING_ALL: &str = "SelectingAll";
/// Event reason: a failed daemon Pod is deleted.
pub const FAILED_DAEMON_POD: &str = "FailedDaemonPod";
/// Event reason: a succeeded daemon Pod is deleted.
pub const SUCCEEDED_DAEMON_POD: &str = "SucceededDaemonPod";

/// The failed-Pod deletion backoff of kube-controller-manager (`flowcontrol.NewBackOff(1s, 15m)`).
pub const FAILED_POD_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// See [`FAILED_POD_BACKOFF_INITIAL`].
pub const FAILED_POD_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// revisionHistoryLimit when unset (the API server defaults it to 10).
const DEFAULT_HISTORY_LIMIT: i32 = 10;

const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

fn spec_of(ds: &DaemonSet) -> Option<&k8s_openapi::api::apps::v1::DaemonSetSpec> {
    ds.spec.as_ref()
}

/// The Pod template (empty when the DaemonSet has no spec, which the API server never serves).
pub fn template(ds: &DaemonSet) -> PodTemplateSpec {
    spec_of(ds).map(|s| s.template.clone()).unwrap_or_default()
}

/// The DaemonSet's selector; an invalid one is an error naming the field.
pub fn selector(ds: &DaemonSet) -> Result<Selector> {
    Selector::parse(spec_of(ds).map(|s| &s.selector)).map_err(|reason| Error::Invalid {
        object: ds.object_name(),
        reason: format!("spec.{reason}"),
    })
}

/// Whether the selector is the empty `{}` one, which upstream refuses to act on (an event
/// `SelectingAll` and no sync). Validation rejects it for apps/v1, so only a very old object can
/// have it.
pub fn selects_everything(ds: &DaemonSet) -> bool {
    spec_of(ds).is_some_and(|s| {
        s.selector
            .match_labels
            .as_ref()
            .is_none_or(|m| m.is_empty())
            && s.selector
                .match_expressions
                .as_ref()
                .is_none_or(|m| m.is_empty())
    })
}

/// `spec.minReadySeconds` (0 when unset).
pub fn min_ready_seconds(ds: &DaemonSet) -> i32 {
    spec_of(ds).and_then(|s| s.min_ready_seconds).unwrap_or(0)
}

/// `spec.revisionHistoryLimit` (the API server's default, 10, when unset).
pub fn revision_history_limit(ds: &DaemonSet) -> i32 {
    spec_of(ds)
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(DEFAULT_HISTORY_LIMIT)
}

/// The update strategy's type (`RollingUpdate` or `OnDelete`; the API server defaults it).
pub fn strategy_type(ds: &DaemonSet) -> &str {
    spec_of(ds)
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .unwrap_or_default()
}

/// `GetTemplateGeneration`: the generation in the deprecated annotation; None when it is missing
/// or not an integer (upstream then relies on the hash alone).
pub fn template_generation(ds: &DaemonSet) -> Option<i64> {
    ds.annotations()
        .get(TEMPLATE_GENERATION_ANNOTATION)
        .and_then(|v| v.parse().ok())
}

fn rolling_param(
    ds: &DaemonSet,
    pick: impl Fn(&k8s_openapi::api::apps::v1::RollingUpdateDaemonSet) -> Option<&IntOrString>,
) -> Option<Option<IntOrString>> {
    if strategy_type(ds) != "RollingUpdate" {
        return None;
    }
    let r = spec_of(ds)?
        .update_strategy
        .as_ref()?
        .rolling_update
        .as_ref()?;
    Some(pick(r).cloned())
}

/// `SurgeCount`: maxSurge scaled to `n` (rounded up); 0 unless RollingUpdate with maxSurge set.
pub fn surge_count(ds: &DaemonSet, n: i32) -> std::result::Result<i32, String> {
    match rolling_param(ds, |r| r.max_surge.as_ref()) {
        Some(Some(v)) => crate::helpers::intstr::scaled_value(&v, n, true),
        _ => Ok(0),
    }
}

/// `UnavailableCount`: maxUnavailable scaled to `n` (rounded up); 0 unless RollingUpdate; an
/// error when RollingUpdate parameters exist without maxUnavailable (the API server defaults it).
pub fn unavailable_count(ds: &DaemonSet, n: i32) -> std::result::Result<i32, String> {
    match rolling_param(ds, |r| r.max_unavailable.as_ref()) {
        Some(Some(v)) => crate::helpers::intstr::scaled_value(&v, n, true),
        Some(None) => Err("nil value for IntOrString".into()),
        None => Ok(0),
    }
}

/// `AllowsSurge`: more than one Pod may run on a node during an update.
pub fn allows_surge(ds: &DaemonSet) -> bool {
    surge_count(ds, 1).is_ok_and(|s| s > 0)
}

// ---- tolerations and eligibility (NodeShouldRunDaemonPod) ----

fn toleration(key: &str, effect: &str) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    }
}

/// `AddOrUpdateTolerationInPodSpec`: a toleration with the same key, operator, value and effect is
/// replaced by `t` (unless equal); otherwise `t` is appended.
fn add_or_update_toleration(spec: &mut PodSpec, t: Toleration) {
    let list = spec.tolerations.get_or_insert_with(Vec::new);
    let same = |x: &Toleration| {
        x.key == t.key && x.effect == t.effect && x.operator == t.operator && x.value == t.value
    };
    match list.iter_mut().find(|x| same(x)) {
        Some(existing) => *existing = t,
        None => list.push(t),
    }
}

/// `AddOrUpdateDaemonPodTolerations` (v1.34): daemon Pods survive the node lifecycle's NoExecute
/// taints for not-ready and unreachable nodes, and ignore the NoSchedule taints of node
/// conditions (disk, memory and PID pressure), of cordoned nodes and, for hostNetwork Pods, of an
/// unavailable network.
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let no_execute = taints::TAINT_EFFECT_NO_EXECUTE;
    let no_schedule = taints::TAINT_EFFECT_NO_SCHEDULE;
    add_or_update_toleration(spec, toleration(TAINT_NOT_READY, no_execute));
    add_or_update_toleration(spec, toleration(TAINT_UNREACHABLE, no_execute));
    add_or_update_toleration(spec, toleration(TAINT_DISK_PRESSURE, no_schedule));
    add_or_update_toleration(spec, toleration(TAINT_MEMORY_PRESSURE, no_schedule));
    add_or_update_toleration(spec, toleration(TAINT_PID_PRESSURE, no_schedule));
    add_or_update_toleration(
        spec,
        toleration(taints::TAINT_NODE_UNSCHEDULABLE, no_schedule),
    );
    if spec.host_network == Some(true) {
        add_or_update_toleration(spec, toleration(TAINT_NETWORK_UNAVAILABLE, no_schedule));
    }
}

/// Where a DaemonSet's Pods may run, parsed once per sync and matched against every node
/// (upstream builds `NewPod(ds, node)` per node; the constraints are the same for every node).
#[derive(Debug, Clone)]
pub struct Eligibility {
    /// `spec.template.spec.nodeName`, when set.
    node_name: Option<String>,
    required: RequiredNodeAffinity,
    tolerations: Vec<Toleration>,
}

impl Eligibility {
    /// The DaemonSet's constraints: its template's nodeName, nodeSelector and required node
    /// affinity, and its tolerations plus the daemon ones.
    pub fn of(ds: &DaemonSet) -> Eligibility {
        let mut spec = template(ds).spec.unwrap_or_default();
        add_daemon_tolerations(&mut spec);
        let node_name = spec.node_name.clone().filter(|n| !n.is_empty());
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        let pod = Pod {
            spec: Some(spec),
            ..Default::default()
        };
        Eligibility {
            node_name,
            required: RequiredNodeAffinity::from_pod(&pod),
            tolerations,
        }
    }

    /// `NodeShouldRunDaemonPod`: `(should_run, should_continue_running)`. A node outside the
    /// template's nodeName, nodeSelector or required node affinity gets no Pod and keeps none;
    /// an untolerated NoSchedule or NoExecute taint blocks new Pods, and only an untolerated
    /// NoExecute taint also removes the running one.
    pub fn should_run(&self, node: &Node) -> (bool, bool) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if self.node_name.as_deref().is_some_and(|n| n != name) {
            return (false, false);
        }
        if !self.required.matches(node) {
            return (false, false);
        }
        let taints = taints::node_taints(node);
        let blocking = taints::find_untolerated_taint(
            taints,
            &self.tolerations,
            taints::is_do_not_schedule_taint,
        );
        if blocking.is_none() {
            return (true, true);
        }
        let evicting = taints::find_untolerated_taint(taints, &self.tolerations, |t| {
            t.effect == taints::TAINT_EFFECT_NO_EXECUTE
        });
        (false, evicting.is_none())
    }
}

/// `NodeShouldRunDaemonPod` for one node (see [`Eligibility::should_run`]).
pub fn node_should_run_daemon_pod(node: &Node, ds: &DaemonSet) -> (bool, bool) {
    Eligibility::of(ds).should_run(node)
}

/// `shouldIgnoreNodeUpdate`, negated: a Node change matters to DaemonSets only when its labels
/// or taints changed.
pub fn node_change_matters(old: &Node, new: &Node) -> bool {
    let taints = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .filter(|t| !t.is_empty())
    };
    let labels = |n: &Node| n.metadata.labels.clone().filter(|l| !l.is_empty());
    labels(old) != labels(new) || taints(old) != taints(new)
}

/// `syncNodeUpdate`'s filter: after a Node was added or changed, the DaemonSet needs a sync when
/// it should now run a Pod there and has none bound there, should no longer keep the one it has,
/// or has one there while it counts misscheduled Pods (the count may have to fall).
pub fn node_update_needs_sync(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    node: &Node,
    scheduled: bool,
) -> bool {
    let (should_run, should_continue) = eligibility.should_run(node);
    let misscheduled = ds
        .status
        .as_ref()
        .is_some_and(|s| s.number_misscheduled > 0);
    if scheduled {
        !should_continue || misscheduled
    } else {
        should_run
    }
}

// ---- the Pod a creation posts ----

/// `ReplaceDaemonSetPodNodeNameNodeAffinity`: the required node affinity becomes one term
/// selecting the node by `metadata.name` (matchFields); preferred terms and other affinities stay.
pub fn replace_node_name_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: OBJECT_NAME_FIELD.into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        match_expressions: None,
    };
    let mut affinity = affinity.unwrap_or_default();
    let na = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    match na
        .required_during_scheduling_ignored_during_execution
        .as_mut()
    {
        Some(sel) => sel.node_selector_terms = vec![term],
        None => {
            na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
                node_selector_terms: vec![term],
            })
        }
    }
    affinity
}

/// `GetTargetNodeName`: the node a daemon Pod is for: its nodeName, or for a Pod not yet bound
/// the single value of the first `metadata.name` In matchFields requirement of its required node
/// affinity. None when neither exists (upstream skips such Pods).
pub fn target_node_name(pod: &CachedPod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    for term in terms {
        for req in term.match_fields.iter().flatten() {
            if req.key == OBJECT_NAME_FIELD && req.operator == "In" {
                let values = req.values.as_deref().unwrap_or_default();
                // More than one value is an error upstream: the Pod is skipped.
                return (values.len() == 1).then(|| values[0].clone());
            }
        }
    }
    None
}

/// `CreatePodTemplate`: the template with the daemon tolerations and the
/// `pod-template-generation` (when known) and `controller-revision-hash` labels.
pub fn create_pod_template(
    template: &PodTemplateSpec,
    generation: Option<i64>,
    hash: &str,
) -> PodTemplateSpec {
    let mut t = template.clone();
    add_daemon_tolerations(t.spec.get_or_insert_with(PodSpec::default));
    let labels = t
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .labels
        .get_or_insert_with(BTreeMap::new);
    if let Some(g) = generation {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), g.to_string());
    }
    if !hash.is_empty() {
        labels.insert(REVISION_HASH_LABEL.into(), hash.into());
    }
    t
}

/// The Pod one creation for `node` posts (upstream's `GetPodFromTemplate` over the
/// [`create_pod_template`] result, with the node affinity of [`replace_node_name_affinity`]):
/// labels, annotations, finalizers and spec of the template, `generateName: <ds>-`, the controller
/// reference. A template without labels is an error naming the field (upstream refuses it).
pub fn new_daemon_pod(ds: &DaemonSet, template: &PodTemplateSpec, node: &str) -> Result<Pod> {
    let labelled = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .is_some_and(|l| !l.is_empty());
    if !labelled {
        return Err(Error::Invalid {
            object: ds.object_name(),
            reason: "spec.template.metadata.labels is empty: Pods without labels are not created"
                .into(),
        });
    }
    let mut pod = pod_control::pod_from_template(template, &OwnerInfo::of(ds));
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.affinity = Some(replace_node_name_affinity(spec.affinity.take(), node));
    Ok(pod)
}

// ---- Pods per node ----

/// A DaemonSet's Pods by the node they are for, each node's Pods in the cache's order.
pub type NodePods = BTreeMap<String, Vec<Arc<CachedPod>>>;

/// `getNodesToDaemonPods` over claimed Pods: grouped by [`target_node_name`]; a Pod both terminal
/// and being deleted is left out unless `include_deleted_terminal` (the kubelet or Pod GC is
/// finishing it); Pods with no target node are skipped.
pub fn nodes_to_daemon_pods(pods: &[Arc<CachedPod>], include_deleted_terminal: bool) -> NodePods {
    let mut out = NodePods::new();
    for p in pods {
        if !include_deleted_terminal && p.is_terminal() && p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = target_node_name(p) {
            out.entry(node).or_default().push(p.clone());
        }
    }
    out
}

/// `podByCreationTimestampAndPhase`: bound Pods first, then older first, then by name.
pub fn by_creation_and_phase(a: &Arc<CachedPod>, b: &Arc<CachedPod>) -> Ordering {
    let bound = |p: &CachedPod| p.node_name().is_some();
    match (bound(a), bound(b)) {
        (true, false) => return Ordering::Less,
        (false, true) => return Ordering::Greater,
        _ => {}
    }
    let created = |p: &CachedPod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match created(a).cmp(&created(b)) {
        Ordering::Equal => a.metadata.name.cmp(&b.metadata.name),
        o => o,
    }
}

fn revision_label(pod: &CachedPod) -> Option<&str> {
    pod.labels().get(REVISION_HASH_LABEL).map(String::as_str)
}

/// `IsPodUpdated`: the Pod carries the current revision's hash, or the current template
/// generation.
pub fn is_pod_updated(pod: &CachedPod, hash: &str, generation: Option<i64>) -> bool {
    let template_matches = generation.is_some_and(|g| {
        pod.labels()
            .get(TEMPLATE_GENERATION_LABEL)
            .map(String::as_str)
            == Some(&g.to_string())
    });
    let hash_matches = !hash.is_empty() && revision_label(pod) == Some(hash);
    hash_matches || template_matches
}

// ---- failed-Pod backoff ----

/// The per-node backoff of failed-Pod deletions (client-go's `flowcontrol.Backoff` without
/// jitter, as kube-controller-manager configures it): a node whose daemon Pod keeps failing
/// (a kubelet rejecting it) is not fought over in a hot loop.
#[derive(Debug)]
pub struct FailedPodsBackoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, (Duration, Instant)>,
}

impl FailedPodsBackoff {
    /// A backoff starting at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn expired(&self, now: Instant, last: Instant) -> bool {
        now.saturating_duration_since(last) > self.max * 2
    }

    /// `IsInBackOffSinceUpdate`: the last deletion for `id` was less than its delay ago.
    pub fn in_backoff(&self, id: &str, now: Instant) -> bool {
        match self.entries.get(id) {
            Some((delay, last)) if !self.expired(now, *last) => {
                now.saturating_duration_since(*last) < *delay
            }
            _ => false,
        }
    }

    /// `Get`: the current delay of `id` (zero when none).
    pub fn delay(&self, id: &str) -> Duration {
        self.entries.get(id).map(|e| e.0).unwrap_or_default()
    }

    /// `Next`: records a deletion for `id` at `now`, doubling its delay (restarting at the
    /// initial delay after 2 x max without one).
    pub fn next(&mut self, id: &str, now: Instant) {
        let delay = match self.entries.get(id) {
            Some((d, last)) if !self.expired(now, *last) => (*d * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(id.to_string(), (delay, now));
    }

    /// `GC`: forgets entries without a deletion for 2 x max.
    pub fn gc(&mut self, now: Instant) {
        let max2 = self.max * 2;
        self.entries
            .retain(|_, (_, last)| now.saturating_duration_since(*last) <= max2);
    }
}

/// `failedPodsBackoffKey`: per DaemonSet uid, observed generation and node.
pub fn failed_pods_backoff_key(ds: &DaemonSet, node: &str) -> String {
    let generation = ds
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    format!("{}/{generation}/{node}", ds.uid().unwrap_or_default())
}

// ---- manage (DS-4, DS-5) ----

/// An event a plan asks to record on the DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEvent {
    /// Warning (else Normal).
    pub warning: bool,
    /// The reason.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// What `manage` (or a rolling-update step) asks of `syncNodes`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeChanges {
    /// Nodes that get a new daemon Pod, in order.
    pub create_on: Vec<String>,
    /// Names of the Pods to delete, in order.
    pub delete: Vec<String>,
    /// Events to record.
    pub events: Vec<PlanEvent>,
    /// Sync again after this long (a failed Pod waiting out its backoff).
    pub requeue_after: Option<Duration>,
}

impl NodeChanges {
    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

/// The clock a plan reads: `instant` for the failed-Pod backoff, `now` for Pod availability.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Monotonic now.
    pub instant: Instant,
    /// Wall-clock now.
    pub now: Timestamp,
}

impl Clock {
    /// The current time.
    pub fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            now: Timestamp::now(),
        }
    }
}

/// `podsShouldBeOnNode`: adds to `out` what `node` needs. A node that should run a Pod and has
/// none gets one. While it should keep running one: failed Pods are deleted (at most once per
/// backoff delay, with a FailedDaemonPod warning), succeeded ones too (SucceededDaemonPod); of
/// the remaining running Pods only the oldest stays, or with maxSurge the oldest current and, while
/// that one is not yet available, the oldest old one (when it is still ready). A node that should
/// not keep a Pod loses every Pod not already being deleted.
#[allow(clippy::too_many_arguments)]
pub fn pods_should_be_on_node(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    node: &Node,
    node_pods: Option<&Vec<Arc<CachedPod>>>,
    hash: &str,
    backoff: &mut FailedPodsBackoff,
    clock: Clock,
    out: &mut NodeChanges,
) {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let (should_run, should_continue) = eligibility.should_run(node);
    let exists = node_pods.is_some();
    let daemon_pods: &[Arc<CachedPod>] = node_pods.map(|v| v.as_slice()).unwrap_or_default();
    if should_run && !exists {
        out.create_on.push(node_name);
        return;
    }
    if should_continue {
        let mut running: Vec<Arc<CachedPod>> = Vec::new();
        for p in daemon_pods {
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ns = p.namespace().unwrap_or_default();
            match p.phase() {
                "Failed" => {
                    let key = failed_pods_backoff_key(ds, &node_name);
                    if backoff.in_backoff(&key, clock.instant) {
                        out.requeue(backoff.delay(&key));
                        continue;
                    }
                    backoff.next(&key, clock.instant);
                    out.events.push(PlanEvent {
                        warning: true,
                        reason: FAILED_DAEMON_POD,
                        message: format!(
                            "Found failed daemon pod {ns}/{} on node {node_name}, will try to kill it",
                            p.name_any()
                        ),
                    });
                    out.delete.push(p.name_any());
                }
                "Succeeded" => {
                    out.events.push(PlanEvent {
                        warning: false,
                        reason: SUCCEEDED_DAEMON_POD,
                        message: format!(
                            "Found succeeded daemon pod {ns}/{} on node {node_name}, will try to delete it",
                            p.name_any()
                        ),
                    });
                    out.delete.push(p.name_any());
                }
                _ => running.push(p.clone()),
            }
        }
        running.sort_by(by_creation_and_phase);
        if !allows_surge(ds) {
            // Without surge only the oldest running Pod stays.
            out.delete
                .extend(running.iter().skip(1).map(|p| p.name_any()));
            return;
        }
        if running.len() <= 1 {
            if running.is_empty() && should_run {
                out.create_on.push(node_name);
            }
            return;
        }
        // With surge, an old and a new Pod may share the node while the new one becomes
        // available; every other Pod goes.
        let (mut oldest_new, mut oldest_old) = (None, None);
        for p in &running {
            let slot = if revision_label(p) == Some(hash) {
                &mut oldest_new
            } else {
                &mut oldest_old
            };
            if slot.is_none() {
                *slot = Some(p.clone());
            } else {
                out.delete.push(p.name_any());
            }
        }
        if let (Some(new), Some(old)) = (oldest_new, oldest_old) {
            if !pods::is_pod_ready(&old)
                || pods::is_pod_available(&new, min_ready_seconds(ds), clock.now)
            {
                out.delete.push(old.name_any());
            }
        }
        return;
    }
    if exists {
        out.delete.extend(
            daemon_pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| p.name_any()),
        );
    }
}

/// `getUnscheduledPodsWithoutNode`: Pods not yet bound whose node no longer exists (the Pod GC
/// only removes bound Pods, so the DaemonSet controller removes these).
pub fn unscheduled_pods_without_node(nodes: &[Arc<Node>], node_pods: &NodePods) -> Vec<String> {
    let existing: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    node_pods
        .iter()
        .filter(|(n, _)| !existing.contains(n.as_str()))
        .flat_map(|(_, pods)| pods.iter())
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty)
        })
        .map(|p| p.name_any())
        .collect()
}

/// `manage` (DS-4): [`pods_should_be_on_node`] over every node (in name order), then the unbound
/// Pods of vanished nodes.
pub fn manage(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    nodes: &[Arc<Node>],
    node_pods: &NodePods,
    hash: &str,
    backoff: &mut FailedPodsBackoff,
    clock: Clock,
) -> NodeChanges {
    let mut out = NodeChanges::default();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        pods_should_be_on_node(
            ds,
            eligibility,
            node,
            node_pods.get(name),
            hash,
            backoff,
            clock,
            &mut out,
        );
    }
    out.delete
        .extend(unscheduled_pods_without_node(nodes, node_pods));
    out
}

// ---- rolling update (DS-7) ----

/// `findUpdatedPodsOnNode`: the node's one current and one old Pod among those not being
/// deleted; None when there are more of either (manage prunes them first).
#[allow(clippy::type_complexity)]
fn updated_pods_on_node(
    pods: &[Arc<CachedPod>],
    hash: &str,
    generation: Option<i64>,
) -> Option<(Option<Arc<CachedPod>>, Option<Arc<CachedPod>>)> {
    let (mut new, mut old) = (None, None);
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let slot = if is_pod_updated(p, hash, generation) {
            &mut new
        } else {
            &mut old
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(p.clone());
    }
    Some((new, old))
}

/// The rollout budget (`updatedDesiredNodeCounts`): `(max_surge, max_unavailable, desired)` for
/// the nodes that should run a Pod; when both come out 0, maxUnavailable is 1 so a rollout can
/// move. Every such node without Pods gets an empty entry in `node_pods`.
pub fn desired_node_counts(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    nodes: &[Arc<Node>],
    node_pods: &mut NodePods,
) -> std::result::Result<(i32, i32, i32), String> {
    let mut desired = 0;
    for node in nodes {
        if !eligibility.should_run(node).0 {
            continue;
        }
        desired += 1;
        let name = node.metadata.name.clone().unwrap_or_default();
        node_pods.entry(name).or_default();
    }
    let max_unavailable = unavailable_count(ds, desired)
        .map_err(|e| format!("invalid value for MaxUnavailable: {e}"))?;
    let max_surge =
        surge_count(ds, desired).map_err(|e| format!("invalid value for MaxSurge: {e}"))?;
    if desired > 0 && max_unavailable == 0 && max_surge == 0 {
        return Ok((0, 1, desired));
    }
    Ok((max_surge, max_unavailable, desired))
}

/// `rollingUpdate` (DS-7). Without surge: old Pods that are not available are replaced at once,
/// then old available ones are deleted while the unavailable count (new Pods not yet available,
/// nodes without a Pod or with two) stays under maxUnavailable; manage creates the replacements.
/// With surge: a new Pod is created beside an old one that is unavailable, and beside up to
/// maxSurge available old ones; an old Pod goes once the new one on its node is available. Nodes
/// are visited in name order (upstream's map order is random). An error names the invalid field.
pub fn rolling_update(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    nodes: &[Arc<Node>],
    mut node_pods: NodePods,
    hash: &str,
    now: Timestamp,
) -> Result<NodeChanges> {
    let invalid = |reason: String| Error::Invalid {
        object: ds.object_name(),
        reason: format!("spec.updateStrategy.rollingUpdate: {reason}"),
    };
    let (max_surge, max_unavailable, desired) =
        desired_node_counts(ds, eligibility, nodes, &mut node_pods).map_err(invalid)?;
    let min_ready = min_ready_seconds(ds);
    let generation = template_generation(ds);
    let available = |p: &CachedPod| pods::is_pod_available(p, min_ready, now);
    let mut out = NodeChanges::default();

    if max_surge == 0 {
        let mut num_unavailable = 0;
        let mut replacements = Vec::new();
        let mut candidates = Vec::new();
        for pods in node_pods.values() {
            let Some((new, old)) = updated_pods_on_node(pods, hash, generation) else {
                // Excess Pods: manage prunes them; the node counts as unavailable meanwhile.
                num_unavailable += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => num_unavailable += 1,
                (Some(new), None) => {
                    if !available(&new) {
                        num_unavailable += 1;
                    }
                }
                (None, Some(old)) => {
                    if !available(&old) {
                        replacements.push(old.name_any());
                        num_unavailable += 1;
                    } else if num_unavailable < max_unavailable {
                        candidates.push(old.name_any());
                    }
                }
            }
        }
        let remaining = (max_unavailable - num_unavailable).clamp(0, candidates.len() as i32);
        out.delete = replacements;
        out.delete
            .extend(candidates.into_iter().take(remaining as usize));
        return Ok(out);
    }

    let node_by_name: HashMap<&str, &Arc<Node>> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect();
    let should_run = |name: &str| -> Result<bool> {
        let node = node_by_name.get(name).ok_or_else(|| Error::Invalid {
            object: ds.object_name(),
            reason: format!("couldn't get node for nodeName {name:?}"),
        })?;
        Ok(eligibility.should_run(node).0)
    };
    let mut old_to_delete = Vec::new();
    let mut should_not_run_to_delete = Vec::new();
    let mut candidate_new_nodes = Vec::new();
    let mut allowed_new_nodes = Vec::new();
    let mut num_surge = 0;
    let mut num_available = 0;
    for (node, pods) in &node_pods {
        let Some((new, old)) = updated_pods_on_node(pods, hash, generation) else {
            // Excess Pods: manage prunes them; the node counts as surging meanwhile.
            num_surge += 1;
            continue;
        };
        match (&old, &new) {
            (Some(o), _) if available(o) => num_available += 1,
            (None, Some(n)) if available(n) => num_available += 1,
            _ => {}
        }
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                if !available(&old) {
                    if !should_run(node)? {
                        old_to_delete.push(old.name_any());
                        continue;
                    }
                    allowed_new_nodes.push(node.clone());
                } else {
                    if !should_run(node)? {
                        should_not_run_to_delete.push(old.name_any());
                        continue;
                    }
                    if num_surge >= max_surge {
                        continue;
                    }
                    candidate_new_nodes.push(node.clone());
                }
            }
            (Some(new), Some(old)) => {
                if !available(&new) {
                    num_surge += 1;
                    continue;
                }
                old_to_delete.push(old.name_any());
            }
        }
    }
    // With surge the owner expects full availability: Pods on nodes that no longer qualify go
    // only as far as Pods elsewhere are available beyond the desired count.
    let deletable = (num_available - desired).clamp(0, should_not_run_to_delete.len() as i32);
    old_to_delete.extend(
        should_not_run_to_delete
            .into_iter()
            .take(deletable as usize),
    );
    let remaining = (max_surge - num_surge).clamp(0, candidate_new_nodes.len() as i32);
    out.create_on = allowed_new_nodes;
    out.create_on
        .extend(candidate_new_nodes.into_iter().take(remaining as usize));
    out.delete = old_to_delete;
    Ok(out)
}

// ---- status (DS-9) ----

/// The counts `updateDaemonSetStatus` computes; per node that should run a Pod, its oldest Pod
/// (bound first) decides ready, available and updated; Pods on nodes that should not run one
/// are misscheduled.
pub fn calculate_status(
    ds: &DaemonSet,
    eligibility: &Eligibility,
    nodes: &[Arc<Node>],
    node_pods: &NodePods,
    hash: &str,
    now: Timestamp,
) -> DaemonSetStatus {
    let (mut desired, mut current, mut misscheduled, mut ready, mut updated, mut available) =
        (0, 0, 0, 0, 0, 0);
    let min_ready = min_ready_seconds(ds);
    let generation = template_generation(ds);
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let (should_run, _) = eligibility.should_run(node);
        let pods_here = node_pods.get(name).filter(|p| !p.is_empty());
        if !should_run {
            if pods_here.is_some() {
                misscheduled += 1;
            }
            continue;
        }
        desired += 1;
        let Some(pods_here) = pods_here else { continue };
        current += 1;
        let pod = pods_here
            .iter()
            .min_by(|a, b| by_creation_and_phase(a, b))
            .expect("not empty");
        if pods::is_pod_ready(pod) {
            ready += 1;
            if pods::is_pod_available(pod, min_ready, now) {
                available += 1;
            }
        }
        if is_pod_updated(pod, hash, generation) {
            updated += 1;
        }
    }
    let old = ds.status.clone().unwrap_or_default();
    DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_ready: ready,
        updated_number_scheduled: Some(updated),
        number_available: Some(available),
        number_unavailable: Some(desired - available),
        observed_generation: old.observed_generation,
        collision_count: old.collision_count,
        conditions: old.conditions,
    }
}

/// `storeDaemonSetStatus`'s short-cut: nothing to write when every count is as stored and
/// observedGeneration is not behind the generation, or is behind but not to be raised
/// (`raise_observed` false: a sync that waits for its expectations). Upstream writes the
/// unchanged status in that last case.
pub fn needs_status_update(ds: &DaemonSet, new: &DaemonSetStatus, raise_observed: bool) -> bool {
    let old = ds.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    old.desired_number_scheduled != new.desired_number_scheduled
        || old.current_number_scheduled != new.current_number_scheduled
        || old.number_misscheduled != new.number_misscheduled
        || old.number_ready != new.number_ready
        || n(old.updated_number_scheduled) != n(new.updated_number_scheduled)
        || n(old.number_available) != n(new.number_available)
        || n(old.number_unavailable) != n(new.number_unavailable)
        || (raise_observed
            && old.observed_generation.unwrap_or(0) < ds.metadata.generation.unwrap_or(0))
}

/// When to look again so availability catches up with minReadySeconds (upstream's last line of
/// defence): after minReadySeconds while some ready Pod is not yet available.
pub fn status_requeue(ds: &DaemonSet, status: &DaemonSetStatus) -> Option<Duration> {
    let min_ready = min_ready_seconds(ds);
    (min_ready > 0 && status.number_ready != status.number_available.unwrap_or(0))
        .then(|| Duration::from_secs(min_ready as u64))
}

// ---- ControllerRevision history (DS-3) ----

/// `getPatch`: what a ControllerRevision stores, a patch replacing the DaemonSet's template:
/// `{"spec":{"template":{...,"$patch":"replace"}}}`.
pub fn revision_data(ds: &DaemonSet) -> Value {
    let mut t = serde_json::to_value(template(ds)).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(obj) = t.as_object_mut() {
        obj.insert("$patch".into(), Value::String("replace".into()));
    }
    serde_json::json!({"spec": {"template": t}})
}

/// JSON with nulls, empty objects and empty lists removed at every depth: two patches that the
/// API server would decode into the same template compare equal.
fn prune(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .iter()
                .map(|i| prune(i).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| prune(v).map(|v| (k.clone(), v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other.clone()),
    }
}

/// `Match`: the revision stores the DaemonSet's current template. Upstream compares the bytes of
/// the two patches; this compares them as JSON without empty fields, so a revision written by
/// kube-controller-manager (Go's encoding) matches the same template here.
pub fn revision_matches(ds: &DaemonSet, cr: &ControllerRevision) -> bool {
    let stored = cr.data.as_ref().map(|d| &d.0).unwrap_or(&Value::Null);
    prune(stored) == prune(&revision_data(ds))
}

/// The hash of the DaemonSet's template and collision count (`controller.ComputeHash`), the
/// suffix of its revisions' names and the value of their `controller-revision-hash` label.
pub fn revision_hash(ds: &DaemonSet) -> String {
    let collision = ds.status.as_ref().and_then(|s| s.collision_count);
    crate::helpers::hash::compute_hash(&template(ds), collision)
}

/// `snapshot`'s revision: named `<ds>-<hash>`, labelled with the template's labels plus the hash,
/// annotated as the DaemonSet, controlled by it, storing [`revision_data`].
pub fn new_revision(ds: &DaemonSet, hash: &str, revision: i64) -> ControllerRevision {
    let mut labels = template(ds)
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.into(), hash.into());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: ds.metadata.annotations.clone().filter(|a| !a.is_empty()),
            owner_references: Some(vec![OwnerInfo::of(ds).controller_ref()]),
            ..Default::default()
        },
        data: Some(RawExtension(revision_data(ds))),
        revision,
    }
}

/// The highest revision number (0 when none).
pub fn max_revision<'a>(crs: impl IntoIterator<Item = &'a Arc<ControllerRevision>>) -> i64 {
    crs.into_iter()
        .map(|c| c.revision)
        .max()
        .unwrap_or(0)
        .max(0)
}

/// Splits the DaemonSet's revisions into those storing its current template and the old ones.
#[allow(clippy::type_complexity)]
pub fn split_histories(
    ds: &DaemonSet,
    histories: &[Arc<ControllerRevision>],
) -> (Vec<Arc<ControllerRevision>>, Vec<Arc<ControllerRevision>>) {
    histories
        .iter()
        .cloned()
        .partition(|h| revision_matches(ds, h))
}

/// `dedupCurHistories`' choice among several current revisions: the one with the highest
/// revision (the last one of equal revisions).
pub fn dedup_keep(current: &[Arc<ControllerRevision>]) -> Option<Arc<ControllerRevision>> {
    let mut keep: Option<&Arc<ControllerRevision>> = None;
    for c in current {
        if keep.is_none_or(|k| c.revision >= k.revision) {
            keep = Some(c);
        }
    }
    keep.cloned()
}

/// The `controller-revision-hash` label of a revision (its name when missing, as upstream labels
/// such revisions).
pub fn revision_hash_label(cr: &ControllerRevision) -> String {
    cr.labels()
        .get(REVISION_HASH_LABEL)
        .cloned()
        .unwrap_or_else(|| cr.name_any())
}

/// `cleanupHistory`: the old revisions to delete so at most revisionHistoryLimit remain, oldest
/// revision first, never one whose hash a live Pod still carries (`pods` includes terminal Pods
/// being deleted).
pub fn histories_to_delete(
    ds: &DaemonSet,
    old: &[Arc<ControllerRevision>],
    pods: &[Arc<CachedPod>],
) -> Vec<String> {
    let to_keep = revision_history_limit(ds).max(0) as usize;
    let mut to_kill = old.len().saturating_sub(to_keep);
    if to_kill == 0 {
        return Vec::new();
    }
    let live: BTreeSet<&str> = pods
        .iter()
        .filter(|p| target_node_name(p).is_some())
        .filter_map(|p| revision_label(p))
        .filter(|h| !h.is_empty())
        .collect();
    let mut sorted: Vec<&Arc<ControllerRevision>> = old.iter().collect();
    sorted.sort_by_key(|h| h.revision);
    let mut out = Vec::new();
    for h in sorted {
        if to_kill == 0 {
            break;
        }
        if live.contains(revision_hash_label(h).as_str()) {
            continue;
        }
        out.push(h.name_any());
        to_kill -= 1;
    }
    out
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
