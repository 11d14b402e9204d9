//! What one StatefulSet sync does, decided purely from the cached set, its claimed Pods, its
//! revisions and its PersistentVolumeClaims (upstream's `defaultStatefulSetControl` and the
//! helpers of `stateful_set_utils.go`, v1.34). Nothing here calls the API server: [`revisions`]
//! says which revision to create or renumber, [`update`] returns the API actions in the order
//! upstream issues them and the status upstream writes.
//!
//! Feature gates as kube-controller-manager v1.34 ships them: `MaxUnavailableStatefulSet` is
//! alpha and off (the API server drops `maxUnavailable`, and the rolling update takes one Pod at
//! a time); `StatefulSetAutoDeletePVC`, `StatefulSetStartOrdinal` and `PodIndexLabel` are GA.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::helpers::meta::ObjectName as _;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::claim::OwnerInfo;
use crate::runtime::history;
use crate::runtime::pods::{is_pod_available, is_pod_ready};

/// The label naming a StatefulSet Pod (`apps.StatefulSetPodNameLabel`), a Service can select it.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label holding a Pod's ordinal (`apps.PodIndexLabel`).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The label naming the revision a Pod was built from (`apps.StatefulSetRevisionLabel`).
pub const REVISION_LABEL: &str = "controller-revision-hash";

const RETAIN: &str = "Retain";
const DELETE: &str = "Delete";

fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

fn set_namespace(set: &StatefulSet) -> &str {
    set.metadata.namespace.as_deref().unwrap_or_default()
}

/// `spec.replicas` (the API server defaults it to 1).
pub fn replicas(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `spec.minReadySeconds`.
pub fn min_ready_seconds(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

/// `getStartOrdinal`: `spec.ordinals.start`, or 0.
pub fn start_ordinal(set: &StatefulSet) -> i64 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .map(i64::from)
        .unwrap_or(0)
}

fn end_ordinal(set: &StatefulSet) -> i64 {
    start_ordinal(set) + i64::from(replicas(set)) - 1
}

/// `allowsBurst`: `podManagementPolicy: Parallel`.
pub fn parallel(set: &StatefulSet) -> bool {
    set.spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref())
        == Some("Parallel")
}

fn strategy_type(set: &StatefulSet) -> &str {
    set.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .unwrap_or("RollingUpdate")
}

/// `Some(partition)` when `updateStrategy.rollingUpdate` is set.
fn partition(set: &StatefulSet) -> Option<i64> {
    set.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .map(|r| i64::from(r.partition.unwrap_or(0)))
}

/// `spec.revisionHistoryLimit` (the API server defaults it to 10).
pub fn revision_history_limit(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10)
}

fn service_name(set: &StatefulSet) -> Option<String> {
    set.spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty())
}

fn claim_templates(set: &StatefulSet) -> &[PersistentVolumeClaim] {
    set.spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_deref())
        .unwrap_or_default()
}

fn template(set: &StatefulSet) -> Option<&PodTemplateSpec> {
    set.spec.as_ref().map(|s| &s.template)
}

/// `(whenDeleted, whenScaled)` of `persistentVolumeClaimRetentionPolicy`, Retain when unset.
fn retention(set: &StatefulSet) -> (&str, &str) {
    let p = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    fn get(v: Option<&String>) -> &str {
        v.map(String::as_str).unwrap_or(RETAIN)
    }
    (
        get(p.and_then(|p| p.when_deleted.as_ref())),
        get(p.and_then(|p| p.when_scaled.as_ref())),
    )
}

// ---- ordinals and identity ----

/// `getParentNameAndOrdinal`: the name split at the last `-` followed only by digits; the
/// ordinal is -1 when there is no such suffix or it does not fit in 32 bits (the parent is
/// empty only when there is no suffix).
pub fn parent_and_ordinal(name: &str) -> (&str, i64) {
    match name.rsplit_once('-') {
        Some((parent, digits))
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (parent, digits.parse::<i32>().map(i64::from).unwrap_or(-1))
        }
        _ => ("", -1),
    }
}

fn pod_name(p: &CachedPod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// The ordinal of a Pod, -1 when its name has none.
pub fn ordinal(p: &CachedPod) -> i64 {
    parent_and_ordinal(pod_name(p)).1
}

/// `isMemberOf`: the Pod's name is `<set>-<digits>`.
pub fn is_member(set: &StatefulSet, p: &CachedPod) -> bool {
    let (parent, _) = parent_and_ordinal(pod_name(p));
    !parent.is_empty() && parent == set_name(set)
}

fn in_ordinal_range(p: &CachedPod, set: &StatefulSet) -> bool {
    let o = ordinal(p);
    o >= start_ordinal(set) && o <= end_ordinal(set)
}

/// `<set>-<ordinal>`.
pub fn ordinal_pod_name(set: &StatefulSet, ordinal: i64) -> String {
    format!("{}-{ordinal}", set_name(set))
}

/// `<claim template>-<set>-<ordinal>`.
pub fn claim_name(set: &StatefulSet, template: &str, ordinal: i64) -> String {
    format!("{template}-{}-{ordinal}", set_name(set))
}

fn labels(p: &CachedPod) -> Option<&BTreeMap<String, String>> {
    p.metadata.labels.as_ref()
}

fn label<'a>(p: &'a CachedPod, key: &str) -> Option<&'a str> {
    labels(p).and_then(|l| l.get(key)).map(String::as_str)
}

/// The revision a Pod was built from (its `controller-revision-hash`), empty when unlabelled.
pub fn pod_revision(p: &CachedPod) -> &str {
    label(p, REVISION_LABEL).unwrap_or_default()
}

/// `identityMatches`: name, namespace and the pod-name label agree with the set.
fn identity_matches(set: &StatefulSet, p: &CachedPod) -> bool {
    let (parent, ord) = parent_and_ordinal(pod_name(p));
    ord >= 0
        && parent == set_name(set)
        && pod_name(p) == ordinal_pod_name(set, ord)
        && p.metadata.namespace.as_deref().unwrap_or_default() == set_namespace(set)
        && label(p, POD_NAME_LABEL) == Some(pod_name(p))
}

/// `storageMatches`: every claim template is mounted from this ordinal's claim.
fn storage_matches(set: &StatefulSet, p: &CachedPod) -> bool {
    let ord = ordinal(p);
    if ord < 0 {
        return false;
    }
    let volumes = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    claim_templates(set).iter().all(|t| {
        let tname = t.metadata.name.as_deref().unwrap_or_default();
        volumes.iter().any(|v| {
            v.name == tname
                && v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.as_str())
                    == Some(claim_name(set, tname, ord).as_str())
        })
    })
}

/// The identity labels `updateIdentity` sets: pod-name and pod-index.
pub fn identity_labels(set: &StatefulSet, ordinal: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (POD_NAME_LABEL.to_string(), ordinal_pod_name(set, ordinal)),
        (POD_INDEX_LABEL.to_string(), ordinal.to_string()),
    ])
}

/// `getPersistentVolumeClaims`: per claim template (in template order), `(template name, claim)`
/// for the ordinal: the template named for the ordinal, in the set's namespace, labelled with
/// the template's labels plus the selector's matchLabels. Owner references come later, from the
/// retention policy.
pub fn pod_claims(set: &StatefulSet, ordinal: i64) -> Vec<(String, PersistentVolumeClaim)> {
    let match_labels = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    claim_templates(set)
        .iter()
        .map(|t| {
            let tname = t.metadata.name.clone().unwrap_or_default();
            let mut claim = t.clone();
            claim.status = None;
            let mut labels = claim.metadata.labels.take().unwrap_or_default();
            labels.extend(match_labels.clone());
            claim.metadata = ObjectMeta {
                name: Some(claim_name(set, &tname, ordinal)),
                namespace: Some(set_namespace(set).to_string()),
                labels: (!labels.is_empty()).then_some(labels),
                annotations: claim.metadata.annotations.take(),
                finalizers: claim.metadata.finalizers.take(),
                ..ObjectMeta::default()
            };
            (tname, claim)
        })
        .collect()
}

/// `updateStorage`: a volume per claim template backed by this ordinal's claim, then the Pod's
/// other volumes (a Pod volume named like a template is replaced).
fn update_storage(set: &StatefulSet, ordinal: i64, volumes: Vec<Volume>) -> Vec<Volume> {
    let claims = pod_claims(set, ordinal);
    let names: HashSet<&str> = claims.iter().map(|(n, _)| n.as_str()).collect();
    let mut out: Vec<Volume> = claims
        .iter()
        .map(|(tname, c)| Volume {
            name: tname.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: c.metadata.name.clone().unwrap_or_default(),
                read_only: Some(false),
            }),
            ..Volume::default()
        })
        .collect();
    out.extend(
        volumes
            .into_iter()
            .filter(|v| !names.contains(v.name.as_str())),
    );
    out
}

fn set_owner(set: &StatefulSet) -> OwnerInfo {
    OwnerInfo::of(set)
}

/// `newStatefulSetPod`: the template as `GetPodFromTemplate` copies it (labels, annotations,
/// finalizers, spec, generateName `<set>-`, the controller reference), named for the ordinal,
/// with the identity labels, hostname and subdomain (`initIdentity`) and the claim volumes.
pub fn new_pod(set: &StatefulSet, ordinal: i64) -> Pod {
    let tpl = template(set).cloned().unwrap_or_default();
    let meta = tpl.metadata.unwrap_or_default();
    let name = ordinal_pod_name(set, ordinal);
    let mut labels = meta.labels.unwrap_or_default();
    labels.extend(identity_labels(set, ordinal));
    let mut spec = tpl.spec.unwrap_or_default();
    spec.hostname = Some(name.clone());
    spec.subdomain = service_name(set);
    spec.volumes = Some(update_storage(
        set,
        ordinal,
        spec.volumes.take().unwrap_or_default(),
    ))
    .filter(|v| !v.is_empty());
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            generate_name: Some(format!("{}-", set_name(set))),
            namespace: Some(set_namespace(set).to_string()),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![set_owner(set).controller_ref()]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// `newVersionedStatefulSetPod`: ordinals below the partition (or, without a rollingUpdate
/// block, below the current replica count) are built from the current revision, the others
/// from the update revision. The condition keeps upstream's operator precedence.
fn new_versioned_pod(
    current_set: &StatefulSet,
    update_set: &StatefulSet,
    current_revision: &str,
    update_revision: &str,
    ordinal: i64,
) -> Pod {
    let start = start_ordinal(current_set);
    let current_replicas = current_set
        .status
        .as_ref()
        .and_then(|s| s.current_replicas)
        .unwrap_or(0);
    let part = partition(current_set);
    let use_current = (strategy_type(current_set) == "RollingUpdate"
        && part.is_none()
        && ordinal < start + i64::from(current_replicas))
        || part.is_some_and(|p| ordinal < start + p);
    let (set, rev) = if use_current {
        (current_set, current_revision)
    } else {
        (update_set, update_revision)
    };
    let mut pod = new_pod(set, ordinal);
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(REVISION_LABEL.into(), rev.into());
    pod
}

// ---- Pod state ----

/// `isCreated`: the API server gave it a phase.
fn is_created(p: &CachedPod) -> bool {
    !p.phase().is_empty()
}

fn is_terminating(p: &CachedPod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// `isRunningAndReady`.
pub fn is_running_and_ready(p: &CachedPod) -> bool {
    p.phase() == "Running" && is_pod_ready(p)
}

/// `isRunningAndAvailable` (upstream checks availability only, not the phase).
fn is_available(p: &CachedPod, min_ready: i32, now: Timestamp) -> bool {
    is_pod_available(p, min_ready, now)
}

fn is_healthy(p: &CachedPod) -> bool {
    is_running_and_ready(p) && !is_terminating(p)
}

// ---- revisions ----

/// `getPatch`: the revision data, `{"spec":{"template":{...,"$patch":"replace"}}}`, with the
/// template encoded as kube-controller-manager v1.34's Go types encode it (an unset
/// `metadata.creationTimestamp` is omitted there since v1.34, as k8s-openapi omits it), so the
/// hash, and with it the revision name, equals kube-controller-manager's.
pub fn revision_data(set: &StatefulSet) -> Result<Value> {
    let tpl = template(set).ok_or_else(|| Error::MissingField {
        kind: "StatefulSet",
        object: set.object_name(),
        field: "spec.template",
    })?;
    let mut t = serde_json::to_value(tpl).map_err(|e| Error::Invalid {
        object: set.object_name(),
        reason: format!("spec.template: {e}"),
    })?;
    let obj = t.as_object_mut().expect("a PodTemplateSpec is an object");
    obj.insert("$patch".into(), json!("replace"));
    Ok(json!({"spec": {"template": t}}))
}

/// `newRevision`: the revision of the set's template numbered `number`: the template's labels,
/// the set's annotations, controlled by the set.
pub fn new_revision(
    set: &StatefulSet,
    number: i64,
    collision_count: i32,
) -> Result<ControllerRevision> {
    let labels = template(set)
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let mut rev = history::new_revision(
        &set_owner(set),
        set_namespace(set),
        &labels,
        revision_data(set)?,
        number,
        collision_count,
    );
    if let Some(a) = set.metadata.annotations.clone() {
        rev.metadata.annotations = Some(a);
    }
    Ok(rev)
}

/// `ApplyRevision`: the set with the revision's template (the revision is a strategic merge
/// patch replacing `spec.template`).
pub fn apply_revision(set: &StatefulSet, rev: &ControllerRevision) -> Result<StatefulSet> {
    let invalid = |reason: String| Error::Invalid {
        object: format!(
            "ControllerRevision {}/{}",
            rev.metadata.namespace.as_deref().unwrap_or_default(),
            rev.metadata.name.as_deref().unwrap_or_default()
        ),
        reason,
    };
    let mut t = history::data(rev)
        .pointer("/spec/template")
        .cloned()
        .ok_or_else(|| invalid("data.spec.template is missing".into()))?;
    if let Some(o) = t.as_object_mut() {
        o.remove("$patch");
    }
    let tpl: PodTemplateSpec =
        serde_json::from_value(t).map_err(|e| invalid(format!("data.spec.template: {e}")))?;
    let mut out = set.clone();
    if let Some(spec) = out.spec.as_mut() {
        spec.template = tpl;
    }
    Ok(out)
}

/// How the update revision is obtained.
#[derive(Debug, Clone)]
pub enum UpdateRevision {
    /// The newest revision already holds the template.
    Existing(Arc<ControllerRevision>),
    /// An older revision holds it: renumber it to the given number (a rollback).
    Renumber(Arc<ControllerRevision>, i64),
    /// No revision holds it: create this one (its name may still collide).
    Create(Box<ControllerRevision>),
}

/// `getStatefulSetRevisions`, decided.
#[derive(Debug, Clone)]
pub struct Revisions {
    /// The update revision.
    pub update: UpdateRevision,
    /// The revision named by `status.currentRevision`, if it still exists (else the update
    /// revision is also the current one).
    pub current: Option<Arc<ControllerRevision>>,
    /// `status.collisionCount`, to be raised by name collisions on creation.
    pub collision_count: i32,
}

/// `getStatefulSetRevisions` over `sorted` (the set's revisions, [`history::sort`]ed).
pub fn revisions(set: &StatefulSet, sorted: &[Arc<ControllerRevision>]) -> Result<Revisions> {
    let collision_count = set
        .status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0);
    let candidate = new_revision(set, history::next_revision(sorted), collision_count)?;
    let equal = history::find_equal(sorted, &candidate);
    let update = match (equal.last(), sorted.last()) {
        (Some(eq), Some(last)) if history::equal(last, eq) => {
            UpdateRevision::Existing(last.clone())
        }
        (Some(eq), _) => UpdateRevision::Renumber(eq.clone(), candidate.revision),
        (None, _) => UpdateRevision::Create(Box::new(candidate)),
    };
    let current_name = set
        .status
        .as_ref()
        .and_then(|s| s.current_revision.as_deref())
        .unwrap_or_default();
    let current = sorted
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(current_name))
        .cloned();
    Ok(Revisions {
        update,
        current,
        collision_count,
    })
}

/// `truncateHistory`: the revisions to delete, the oldest non-live first, beyond the history
/// limit. Live: the current and update revisions and every Pod's revision.
pub fn revisions_to_truncate(
    set: &StatefulSet,
    pods: &[Arc<CachedPod>],
    sorted: &[Arc<ControllerRevision>],
    current: Option<&str>,
    update: Option<&str>,
) -> Vec<Arc<ControllerRevision>> {
    let mut live: HashSet<&str> = pods.iter().map(|p| pod_revision(p)).collect();
    live.extend(current);
    live.extend(update);
    history::to_truncate(sorted, &live, revision_history_limit(set))
}

// ---- PVC retention (owner references) ----

const POD_API: &str = "v1";

struct Obj<'a> {
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    uid: &'a str,
}

fn set_obj(set: &StatefulSet) -> Obj<'_> {
    Obj {
        api_version: "apps/v1",
        kind: "StatefulSet",
        name: set_name(set),
        uid: set.metadata.uid.as_deref().unwrap_or_default(),
    }
}

fn pod_obj(p: &CachedPod) -> Obj<'_> {
    Obj {
        api_version: POD_API,
        kind: "Pod",
        name: pod_name(p),
        uid: p.metadata.uid.as_deref().unwrap_or_default(),
    }
}

/// `matchesRef`: same apiVersion, kind and name (not uid).
fn matches_ref(r: &OwnerReference, o: &Obj<'_>) -> bool {
    r.api_version == o.api_version && r.kind == o.kind && r.name == o.name
}

fn refs(c: &PersistentVolumeClaim) -> &[OwnerReference] {
    c.metadata.owner_references.as_deref().unwrap_or_default()
}

fn has_owner_ref(c: &PersistentVolumeClaim, o: &Obj<'_>) -> bool {
    refs(c).iter().any(|r| r.uid == o.uid)
}

/// `hasStaleOwnerRef`: the first reference naming the object carries another uid.
fn has_stale_owner_ref(c: &PersistentVolumeClaim, o: &Obj<'_>) -> bool {
    refs(c)
        .iter()
        .find(|r| matches_ref(r, o))
        .is_some_and(|r| r.uid != o.uid)
}

/// `hasUnexpectedController`: with a Delete policy, a controller other than the set or the Pod
/// (or a reference to them with a stale uid).
fn has_unexpected_controller(
    c: &PersistentVolumeClaim,
    set: &StatefulSet,
    pod: &CachedPod,
) -> bool {
    let (when_deleted, when_scaled) = retention(set);
    if when_deleted == RETAIN && when_scaled == RETAIN {
        return false;
    }
    let (s, p) = (set_obj(set), pod_obj(pod));
    for r in refs(c) {
        if matches_ref(r, &s) {
            if r.uid != s.uid {
                return true;
            }
            continue;
        }
        if matches_ref(r, &p) {
            if r.uid != p.uid {
                return true;
            }
            continue;
        }
        if r.controller == Some(true) {
            return true;
        }
    }
    false
}

/// `hasNonControllerOwner`.
fn has_non_controller_owner(c: &PersistentVolumeClaim, set: &StatefulSet, pod: &CachedPod) -> bool {
    let (s, p) = (set_obj(set), pod_obj(pod));
    refs(c)
        .iter()
        .any(|r| (r.uid == s.uid || r.uid == p.uid) && r.controller != Some(true))
}

/// `isClaimOwnerUpToDate`: the claim's references to the set and the Pod are what the retention
/// policy asks (Retain/Retain none; WhenDeleted=Delete the set; WhenScaled=Delete the Pod once
/// it is scaled away); a claim with stale references or another controller is left alone.
pub fn claim_owner_up_to_date(
    c: &PersistentVolumeClaim,
    set: &StatefulSet,
    pod: &CachedPod,
) -> bool {
    let (s, p) = (set_obj(set), pod_obj(pod));
    if has_stale_owner_ref(c, &s) || has_stale_owner_ref(c, &p) {
        return true;
    }
    if has_unexpected_controller(c, set, pod) {
        return !(has_owner_ref(c, &s) || has_owner_ref(c, &p));
    }
    if has_non_controller_owner(c, set, pod) {
        return false;
    }
    let scaled_down = !in_ordinal_range(pod, set);
    match retention(set) {
        (DELETE, RETAIN) => has_owner_ref(c, &s) && !has_owner_ref(c, &p),
        (RETAIN, DELETE) => !has_owner_ref(c, &s) && scaled_down == has_owner_ref(c, &p),
        (DELETE, DELETE) => {
            scaled_down != has_owner_ref(c, &s) && scaled_down == has_owner_ref(c, &p)
        }
        // Retain/Retain, and an unknown policy treated as Retain.
        _ => !(has_owner_ref(c, &s) || has_owner_ref(c, &p)),
    }
}

fn controller_ref(o: &Obj<'_>) -> OwnerReference {
    OwnerReference {
        api_version: o.api_version.into(),
        kind: o.kind.into(),
        name: o.name.into(),
        uid: o.uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// `updateClaimOwnerRefForSetAndPod`: the claim's references with those to the set and the Pod
/// replaced by what the retention policy asks.
pub fn claim_owner_refs(
    c: &PersistentVolumeClaim,
    set: &StatefulSet,
    pod: &CachedPod,
) -> Vec<OwnerReference> {
    let (s, p) = (set_obj(set), pod_obj(pod));
    let unexpected = has_unexpected_controller(c, set, pod);
    let mut out: Vec<OwnerReference> = refs(c)
        .iter()
        .filter(|r| !(matches_ref(r, &s) || matches_ref(r, &p)))
        .cloned()
        .collect();
    if unexpected {
        return out;
    }
    let mut add = |o: &Obj<'_>| {
        if !out.iter().any(|r| r.uid == o.uid) {
            out.push(controller_ref(o));
        }
    };
    let scaled_down = !in_ordinal_range(pod, set);
    match retention(set) {
        (DELETE, RETAIN) => add(&s),
        (RETAIN, DELETE) if scaled_down => add(&p),
        (DELETE, DELETE) if scaled_down => add(&p),
        (DELETE, DELETE) => add(&s),
        _ => {}
    }
    out
}

// ---- the update ----

/// Why a Pod is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// Failed or Succeeded: recreated on a later sync.
    Finished,
    /// Ordinal outside the wanted range (scale-down).
    Condemned,
    /// Not at the update revision (rolling update).
    Update,
}

/// One API action.
#[derive(Debug, Clone)]
pub enum Action {
    /// Create this claim of the Pod (`pod`).
    CreateClaim {
        /// The Pod it is for (events).
        pod: String,
        /// The claim.
        claim: Box<PersistentVolumeClaim>,
    },
    /// Fail the step: an existing claim of the Pod is being deleted.
    ClaimTerminating {
        /// The claim's name.
        claim: String,
    },
    /// Set a claim's owner references (the retention policy), `uid`/resourceVersion-guarded.
    SetClaimOwners {
        /// The cached claim.
        claim: Arc<PersistentVolumeClaim>,
        /// The references it must carry.
        refs: Vec<OwnerReference>,
        /// The Pod a failure is reported for (a FailedUpdate event, as upstream records one
        /// except when fixing the claims of condemned Pods).
        report: Option<String>,
    },
    /// Warn that a claim has a conflicting controller (its retention policy is ignored).
    ConflictingController {
        /// The claim's name.
        claim: String,
    },
    /// Create the Pod.
    CreatePod(Box<Pod>),
    /// Delete the Pod.
    DeletePod {
        /// The cached Pod.
        pod: Arc<CachedPod>,
        /// Why.
        reason: DeleteReason,
    },
    /// Put the identity labels on the Pod.
    SetIdentity {
        /// The cached Pod.
        pod: Arc<CachedPod>,
        /// The labels to set.
        labels: BTreeMap<String, String>,
    },
    /// Mount the claims on the Pod (upstream's update; the API server refuses volume changes of
    /// a running Pod, so this fails as upstream's does).
    SetStorage {
        /// The cached Pod.
        pod: Arc<CachedPod>,
        /// The volumes it must have.
        volumes: Vec<Volume>,
    },
    /// Record that the Pod was updated (identity, storage or claims), as upstream's
    /// SuccessfulUpdate event.
    PodUpdated {
        /// The Pod's name.
        pod: String,
    },
}

/// A group of actions for one Pod, run in order; the first failure ends the group.
pub type Group = Vec<Action>;

/// A pass: its groups run one after the other (OrderedReady) or concurrently in slow-start
/// batches (Parallel); a failure ends the sync after the pass.
pub type Pass = Vec<Group>;

/// What one sync does.
#[derive(Debug, Clone, Default)]
pub struct Update {
    /// The passes, in order.
    pub passes: Vec<Pass>,
    /// Whether groups of a pass run concurrently (`podManagementPolicy: Parallel`).
    pub parallel: bool,
    /// The status upstream computes (before `completeRollingUpdate`).
    pub status: StatefulSetStatus,
}

#[derive(Default)]
struct Counts {
    replicas: i32,
    ready: i32,
    available: i32,
    current: i32,
    updated: i32,
}

/// `computeReplicaStatus` over the Pods (objects not yet created do not count).
fn counts<'a>(
    pods: impl IntoIterator<Item = &'a CachedPod>,
    min_ready: i32,
    current: &str,
    update: &str,
    now: Timestamp,
) -> Counts {
    let mut c = Counts::default();
    for p in pods {
        if is_created(p) {
            c.replicas += 1;
        }
        if is_running_and_ready(p) {
            c.ready += 1;
            if is_available(p, min_ready, now) {
                c.available += 1;
            }
        }
        if is_created(p) && !is_terminating(p) {
            let rev = pod_revision(p);
            if rev == current {
                c.current += 1;
            }
            if rev == update {
                c.updated += 1;
            }
        }
    }
    c
}

/// The inputs of [`update`].
pub struct Inputs<'a> {
    /// The set.
    pub set: &'a StatefulSet,
    /// Its claimed Pods.
    pub pods: &'a [Arc<CachedPod>],
    /// The current revision.
    pub current: &'a ControllerRevision,
    /// The update revision.
    pub update: &'a ControllerRevision,
    /// The collision count after creating the update revision.
    pub collision_count: i32,
    /// The cached claim of the set's namespace with this name.
    pub claim: &'a (dyn Fn(&str) -> Option<Arc<PersistentVolumeClaim>> + Send + Sync),
    /// The time availability is judged at.
    pub now: Timestamp,
}

/// A replica slot: a cached Pod, or one to create.
#[derive(Clone)]
enum Slot {
    Cached(Arc<CachedPod>),
    New(Box<NewPod>),
}

/// A Pod to create, and the view of it the plan reads as it reads cached ones.
#[derive(Clone)]
struct NewPod {
    pod: Pod,
    view: CachedPod,
}

impl Slot {
    fn new(pod: Pod) -> Self {
        let view = CachedPod::from(&pod);
        Slot::New(Box::new(NewPod { pod, view }))
    }

    fn pod(&self) -> &CachedPod {
        match self {
            Slot::Cached(p) => p,
            Slot::New(n) => &n.view,
        }
    }
}

struct Planner<'a> {
    inp: &'a Inputs<'a>,
    update_set: StatefulSet,
    monotonic: bool,
    min_ready: i32,
}

impl Planner<'_> {
    fn set(&self) -> &StatefulSet {
        self.inp.set
    }

    /// `createPersistentVolumeClaims`: claims not in the cache are created; an existing claim
    /// being deleted fails the group.
    fn create_claims(&self, set: &StatefulSet, pod: &CachedPod, out: &mut Group) {
        for (_, c) in pod_claims(set, ordinal(pod)) {
            let name = c.metadata.name.clone().unwrap_or_default();
            match (self.inp.claim)(&name) {
                None => out.push(Action::CreateClaim {
                    pod: pod_name(pod).into(),
                    claim: Box::new(c),
                }),
                Some(existing) if existing.metadata.deletion_timestamp.is_some() => {
                    out.push(Action::ClaimTerminating { claim: name })
                }
                Some(_) => {}
            }
        }
    }

    fn cached_claims(&self, set: &StatefulSet, pod: &CachedPod) -> Vec<Arc<PersistentVolumeClaim>> {
        claim_templates(set)
            .iter()
            .filter_map(|t| {
                let n = claim_name(
                    set,
                    t.metadata.name.as_deref().unwrap_or_default(),
                    ordinal(pod),
                );
                (self.inp.claim)(&n)
            })
            .collect()
    }

    /// `ClaimsMatchRetentionPolicy` (claims not cached yet are picked up later).
    fn claims_match(&self, set: &StatefulSet, pod: &CachedPod) -> bool {
        self.cached_claims(set, pod)
            .iter()
            .all(|c| claim_owner_up_to_date(c, set, pod))
    }

    /// `UpdatePodClaimForRetentionPolicy`; `report`: a failure is recorded as the Pod's
    /// FailedUpdate.
    fn update_claims(&self, set: &StatefulSet, pod: &CachedPod, report: bool, out: &mut Group) {
        for c in self.cached_claims(set, pod) {
            if has_unexpected_controller(&c, set, pod) {
                out.push(Action::ConflictingController {
                    claim: c.metadata.name.clone().unwrap_or_default(),
                });
            }
            if !claim_owner_up_to_date(&c, set, pod) {
                let refs = claim_owner_refs(&c, set, pod);
                out.push(Action::SetClaimOwners {
                    claim: c,
                    refs,
                    report: report.then(|| pod_name(pod).to_string()),
                });
            }
        }
    }

    /// `PodClaimIsStale`: with WhenScaled=Delete, a claim still owned by an earlier Pod of this
    /// name blocks the creation until the garbage collector removed it.
    fn claim_is_stale(&self, pod: &CachedPod) -> bool {
        let set = self.set();
        if retention(set).1 == RETAIN {
            return false;
        }
        let p = pod_obj(pod);
        self.cached_claims(set, pod)
            .iter()
            .any(|c| has_stale_owner_ref(c, &p))
    }

    /// `processReplica`: the group for one slot, and whether a monotonic walk stops after it.
    fn replica(&self, slot: &Slot) -> (Group, bool) {
        let set = self.set();
        let mut g = Group::new();
        let pod = slot.pod();
        let ph = pod.phase();
        if ph == "Failed" || ph == "Succeeded" {
            if let Slot::Cached(p) = slot {
                if !is_terminating(p) {
                    g.push(Action::DeletePod {
                        pod: p.clone(),
                        reason: DeleteReason::Finished,
                    });
                }
            }
            // The new Pod is built on a later sync, once this one is gone.
            return (g, true);
        }
        let cached = match slot {
            Slot::Cached(cached) => cached,
            Slot::New(new) => {
                if self.claim_is_stale(pod) {
                    return (g, true);
                }
                // CreateStatefulPod: claims first, the Pod, then the retention policy on the
                // claims that were already cached.
                self.create_claims(set, pod, &mut g);
                g.push(Action::CreatePod(Box::new(new.pod.clone())));
                self.update_claims(set, pod, true, &mut g);
                // In a Parallel walk the new Pod has nothing more to check this sync.
                return (g, true);
            }
        };
        if ph == "Pending" {
            self.create_claims(set, pod, &mut g);
            self.update_claims(set, pod, true, &mut g);
        }
        if self.monotonic
            && (is_terminating(pod)
                || !is_running_and_ready(pod)
                || !is_available(pod, self.min_ready, self.inp.now))
        {
            return (g, true);
        }
        let us = &self.update_set;
        let retention_ok = self.claims_match(us, pod);
        if identity_matches(set, pod) && storage_matches(set, pod) && retention_ok {
            return (g, false);
        }
        // UpdateStatefulPod against the update revision's set.
        if !identity_matches(us, pod) {
            g.push(Action::SetIdentity {
                pod: cached.clone(),
                labels: identity_labels(us, ordinal(pod)),
            });
        }
        if !storage_matches(us, pod) {
            self.create_claims(us, pod, &mut g);
            // The claim volumes only: the strategic-merge patch that writes them merges volumes
            // by name, so the Pod's other volumes stay as they are.
            g.push(Action::SetStorage {
                pod: cached.clone(),
                volumes: update_storage(us, ordinal(pod), Vec::new()),
            });
        }
        if !retention_ok {
            self.update_claims(us, pod, true, &mut g);
        }
        g.push(Action::PodUpdated {
            pod: pod_name(pod).into(),
        });
        (g, false)
    }

    /// `processCondemned`.
    fn condemned(&self, pod: &Arc<CachedPod>, first_unhealthy: Option<&str>) -> (Group, bool) {
        if is_terminating(pod) {
            return (Group::new(), self.monotonic);
        }
        let first = first_unhealthy == Some(pod_name(pod));
        if self.monotonic
            && !first
            && (!is_running_and_ready(pod) || !is_available(pod, self.min_ready, self.inp.now))
        {
            return (Group::new(), true);
        }
        let delete = Action::DeletePod {
            pod: pod.clone(),
            reason: DeleteReason::Condemned,
        };
        (vec![delete], true)
    }
}

/// Walks `items`: a monotonic walk stops after the first group that says so (the pass then ends
/// the sync); a parallel walk takes every group and ends the sync only on failure.
fn walk<T>(items: &[T], monotonic: bool, f: impl Fn(&T) -> (Group, bool)) -> (Pass, bool) {
    let mut pass = Pass::new();
    for it in items {
        let (g, stop) = f(it);
        if !g.is_empty() {
            pass.push(g);
        }
        if monotonic && stop {
            return (pass, true);
        }
    }
    (pass, false)
}

/// `updateStatefulSet`: the actions of one sync and the status it writes.
pub fn update(inp: &Inputs<'_>) -> Result<Update> {
    let set = inp.set;
    let current_set = apply_revision(set, inp.current)?;
    let update_set = apply_revision(set, inp.update)?;
    let current_name = inp.current.metadata.name.clone().unwrap_or_default();
    let update_name = inp.update.metadata.name.clone().unwrap_or_default();
    let min_ready = min_ready_seconds(set);
    let monotonic = !parallel(set);

    let mut status = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        current_revision: Some(current_name.clone()),
        update_revision: Some(update_name.clone()),
        collision_count: Some(inp.collision_count),
        ..StatefulSetStatus::default()
    };
    let fill = |status: &mut StatefulSetStatus, c: Counts| {
        status.replicas = c.replicas;
        status.ready_replicas = Some(c.ready);
        status.available_replicas = Some(c.available);
        status.current_replicas = Some(c.current);
        status.updated_replicas = Some(c.updated);
    };

    // Partition: replicas by ordinal, condemned (descending), new Pods for the gaps.
    let (start, n) = (start_ordinal(set), replicas(set).max(0) as usize);
    let mut slots: Vec<Option<Slot>> = vec![None; n];
    let mut condemned: Vec<Arc<CachedPod>> = Vec::new();
    for p in inp.pods {
        if in_ordinal_range(p, set) {
            slots[(ordinal(p) - start) as usize] = Some(Slot::Cached(p.clone()));
        } else if ordinal(p) >= 0 {
            condemned.push(p.clone());
        }
    }
    let slots: Vec<Slot> = slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.unwrap_or_else(|| {
                Slot::new(new_versioned_pod(
                    &current_set,
                    &update_set,
                    &current_name,
                    &update_name,
                    start + i as i64,
                ))
            })
        })
        .collect();
    condemned.sort_by_key(|p| std::cmp::Reverse(ordinal(p)));

    let exit_counts = || {
        counts(
            slots
                .iter()
                .map(Slot::pod)
                .chain(condemned.iter().map(|p| p.as_ref())),
            min_ready,
            &current_name,
            &update_name,
            inp.now,
        )
    };

    if set.metadata.deletion_timestamp.is_some() {
        // A set being deleted only gets its status.
        fill(
            &mut status,
            counts(
                inp.pods.iter().map(|p| p.as_ref()),
                min_ready,
                &current_name,
                &update_name,
                inp.now,
            ),
        );
        return Ok(Update {
            passes: Vec::new(),
            parallel: !monotonic,
            status,
        });
    }

    // The first unhealthy Pod: the lowest ordinal among replicas, then among condemned.
    let first_unhealthy = slots
        .iter()
        .map(Slot::pod)
        .chain(condemned.iter().rev().map(|p| p.as_ref()))
        .find(|p| !is_healthy(p))
        .map(|p| pod_name(p).to_string());

    let planner = Planner {
        inp,
        update_set,
        monotonic,
        min_ready,
    };
    let mut out = Update {
        passes: Vec::new(),
        parallel: !monotonic,
        status: StatefulSetStatus::default(),
    };
    let finish = |mut out: Update, mut status: StatefulSetStatus, rolled: bool| {
        fill(&mut status, exit_counts());
        if rolled {
            let c = status.current_replicas.unwrap_or(0);
            status.current_replicas = Some(c - 1);
        }
        out.status = status;
        out.passes.retain(|p| !p.is_empty());
        Ok(out)
    };

    let (pass, stop) = walk(&slots, monotonic, |s| planner.replica(s));
    out.passes.push(pass);
    if stop {
        return finish(out, status, false);
    }

    // The retention policy on the claims of condemned Pods.
    let (pass, _) = walk(&condemned, monotonic, |p| {
        let mut g = Group::new();
        if !planner.claims_match(&planner.update_set, p) {
            planner.update_claims(&planner.update_set, p, false, &mut g);
        }
        (g, false)
    });
    out.passes.push(pass);

    let (pass, stop) = walk(&condemned, monotonic, |p| {
        planner.condemned(p, first_unhealthy.as_deref())
    });
    out.passes.push(pass);
    if stop {
        return finish(out, status, false);
    }

    if strategy_type(set) == "OnDelete" {
        return finish(out, status, false);
    }

    // RollingUpdate (MaxUnavailableStatefulSet off): from the highest index down to the
    // partition, delete the first Pod not at the update revision; wait on an unhealthy one.
    let update_min = partition(set).unwrap_or(0).max(0) as usize;
    for target in (update_min..slots.len()).rev() {
        let p = slots[target].pod();
        if pod_revision(p) != update_name && !is_terminating(p) {
            if let Slot::Cached(cached) = &slots[target] {
                out.passes.push(vec![vec![Action::DeletePod {
                    pod: cached.clone(),
                    reason: DeleteReason::Update,
                }]]);
                return finish(out, status, true);
            }
        }
        if !is_healthy(p) {
            break;
        }
    }
    finish(out, status, false)
}

/// `completeRollingUpdate`: once every replica is updated and ready, the update revision becomes
/// the current one.
pub fn complete_rolling_update(set: &StatefulSet, status: &mut StatefulSetStatus) {
    let want = replicas(set);
    if strategy_type(set) == "RollingUpdate"
        && status.updated_replicas.unwrap_or(0) == want
        && status.ready_replicas.unwrap_or(0) == want
        && status.replicas == want
    {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
}

/// `inconsistentStatus`: whether `status` differs from the set's in a field upstream compares
/// (the collision count alone is not written).
pub fn needs_status_update(set: &StatefulSet, status: &StatefulSetStatus) -> bool {
    let old = set.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    status.observed_generation.unwrap_or(0) > old.observed_generation.unwrap_or(0)
        || status.replicas != old.replicas
        || n(status.current_replicas) != n(old.current_replicas)
        || n(status.ready_replicas) != n(old.ready_replicas)
        || n(status.updated_replicas) != n(old.updated_replicas)
        || status.current_revision.as_deref().unwrap_or_default()
            != old.current_revision.as_deref().unwrap_or_default()
        || n(status.available_replicas) != n(old.available_replicas)
        || status.update_revision.as_deref().unwrap_or_default()
            != old.update_revision.as_deref().unwrap_or_default()
}

/// The first `(namespace, set name)` a Pod's name makes it a member of, for the Pod cache's
/// member index.
pub fn member_key(p: &CachedPod) -> Option<String> {
    let (parent, _) = parent_and_ordinal(pod_name(p));
    (!parent.is_empty()).then(|| {
        format!(
            "{}/{parent}",
            p.metadata.namespace.as_deref().unwrap_or_default()
        )
    })
}
