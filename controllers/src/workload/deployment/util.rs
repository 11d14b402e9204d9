//! The Deployment controller's vocabulary, as kube-controller-manager v1.34's
//! `pkg/controller/deployment/util` and the ReplicaSet helpers of `controller_utils.go` define it:
//! the pod-template hash and ReplicaSet names, revisions and the annotations copied to
//! ReplicaSets, the Progressing / Available conditions, maxSurge / maxUnavailable arithmetic,
//! proportional-scaling fractions, the ReplicaSet sort orders and replica counts.
//!
//! Pure functions over API objects; nothing here reads a cache or calls the API server, and
//! nothing here decides what a sync does (that is `plan`).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetCondition,
    RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub use crate::helpers::hash::{compute_hash, template_form};
pub use crate::helpers::intstr::scaled_value;

pub use crate::helpers::hash::POD_TEMPLATE_HASH;
/// The revision of a ReplicaSet, and of the Deployment (its newest ReplicaSet's).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The earlier revisions a reused ReplicaSet had, comma-separated.
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// `spec.replicas` of the Deployment when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas + maxSurge` of the Deployment when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// The annotation that round-trips the removed `spec.rollbackTo` field of extensions/v1beta1
/// (`apps.DeprecatedRollbackTo`). apps/v1 has no rollbackTo field and `kubectl rollout undo`
/// patches the template instead, but v1.34 still honours the annotation when someone sets it.
pub const DEPRECATED_ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
/// kubectl apply's annotation, never copied to ReplicaSets.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// `revision-history` is kept under this many characters (`maxRevHistoryLengthInChars`).
pub const MAX_REVISION_HISTORY_CHARS: usize = 2000;

/// Condition types.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: enough Pods are available.
pub const AVAILABLE: &str = "Available";
/// Condition type copied from a ReplicaSet's ReplicaFailure.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// Reasons and event reasons, as upstream spells them.
pub const REASON_RS_UPDATED: &str = "ReplicaSetUpdated";
/// Creating the new ReplicaSet failed.
pub const REASON_RS_CREATE_ERROR: &str = "ReplicaSetCreateError";
/// The new ReplicaSet was created by this sync.
pub const REASON_NEW_RS_CREATED: &str = "NewReplicaSetCreated";
/// The new ReplicaSet already existed.
pub const REASON_FOUND_NEW_RS: &str = "FoundNewReplicaSet";
/// The rollout is complete.
pub const REASON_NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
/// progressDeadlineSeconds passed without progress.
pub const REASON_TIMED_OUT: &str = "ProgressDeadlineExceeded";
/// The Deployment is paused.
pub const REASON_PAUSED: &str = "DeploymentPaused";
/// The Deployment was resumed.
pub const REASON_RESUMED: &str = "DeploymentResumed";
/// availableReplicas >= replicas - maxUnavailable.
pub const REASON_MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
/// availableReplicas < replicas - maxUnavailable.
pub const REASON_MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
/// Event: the legacy rollback found no such revision.
pub const REASON_ROLLBACK_NOT_FOUND: &str = "DeploymentRollbackRevisionNotFound";
/// Event: the legacy rollback's revision has the current template.
pub const REASON_ROLLBACK_UNCHANGED: &str = "DeploymentRollbackTemplateUnchanged";
/// Event: the legacy rollback was done.
pub const REASON_ROLLBACK_DONE: &str = "DeploymentRollback";

/// `validation.DNS1123SubdomainMaxLength`.
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// `spec.replicas`, defaulted as the API server does (1).
pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// A ReplicaSet's `spec.replicas`, defaulted as the API server does (1).
pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// Sets a ReplicaSet's `spec.replicas`.
pub fn set_rs_replicas(rs: &mut ReplicaSet, n: i32) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(n);
}

/// `status.replicas` of a ReplicaSet.
pub fn rs_status_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map_or(0, |s| s.replicas)
}

/// `status.availableReplicas` of a ReplicaSet.
pub fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

fn rs_ready(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

fn annotation<'a>(
    meta_annotations: &'a Option<BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    meta_annotations.as_ref()?.get(key).map(String::as_str)
}

/// The Deployment with the API server's defaults filled in (`SetDefaults_Deployment`): replicas
/// 1, strategy RollingUpdate with maxSurge and maxUnavailable 25%, revisionHistoryLimit 10,
/// progressDeadlineSeconds 600. Objects read from the API server already have them; the plan
/// applies them anyway so that it never reads an unset field differently from upstream.
pub fn with_defaults(d: &Deployment) -> Deployment {
    let mut d = d.clone();
    let spec = d.spec.get_or_insert_with(Default::default);
    spec.replicas.get_or_insert(1);
    let strategy = spec.strategy.get_or_insert_with(Default::default);
    let ty = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
    if ty == "RollingUpdate" {
        let ru = strategy
            .rolling_update
            .get_or_insert_with(RollingUpdateDeployment::default);
        ru.max_unavailable
            .get_or_insert_with(|| IntOrString::String("25%".into()));
        ru.max_surge
            .get_or_insert_with(|| IntOrString::String("25%".into()));
    }
    spec.revision_history_limit.get_or_insert(10);
    spec.progress_deadline_seconds.get_or_insert(600);
    d
}

/// `spec.strategy.type` ("" when unset).
pub fn strategy_type(d: &Deployment) -> &str {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .unwrap_or_default()
}

/// `IsRollingUpdate`.
pub fn is_rolling_update(d: &Deployment) -> bool {
    strategy_type(d) == "RollingUpdate"
}

fn rolling_update(d: &Deployment) -> Option<&RollingUpdateDeployment> {
    d.spec.as_ref()?.strategy.as_ref()?.rolling_update.as_ref()
}

/// `ResolveFenceposts`: (surge, unavailable) for `desired` replicas; percentages of surge round
/// up and of unavailability round down; when both come out 0, unavailable is 1 (a rollout must be
/// able to move).
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), String> {
    let zero = IntOrString::Int(0);
    let surge = scaled_value(max_surge.unwrap_or(&zero), desired, true)?;
    let mut unavailable = scaled_value(max_unavailable.unwrap_or(&zero), desired, false)?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable))
}

fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = rolling_update(d);
    // Upstream ignores the error here (the API server validates both fields): 0, 0.
    resolve_fenceposts(
        ru.and_then(|r| r.max_surge.as_ref()),
        ru.and_then(|r| r.max_unavailable.as_ref()),
        replicas(d),
    )
    .unwrap_or((0, 0))
}

/// `MaxSurge`: 0 unless RollingUpdate.
pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling_update(d) {
        return 0;
    }
    fenceposts(d).0
}

/// `MaxUnavailable`: 0 unless RollingUpdate with replicas > 0; never more than replicas.
pub fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling_update(d) || replicas(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(replicas(d))
}

/// `generateReplicaSetName`: `<deployment>-<hash>`, the Deployment's name cut so the whole fits
/// a DNS-1123 subdomain (253 characters).
pub fn replica_set_name(deployment: &str, hash: &str) -> String {
    let max = DNS1123_SUBDOMAIN_MAX as isize - 1 - hash.len() as isize;
    if max > 0 && deployment.len() > max as usize {
        // Names are ASCII (DNS-1123), so a byte cut is a character cut.
        return format!("{}-{hash}", &deployment[..max as usize]);
    }
    format!("{deployment}-{hash}")
}

/// `EqualIgnoreHash`: the templates are equal once the pod-template-hash label is left out.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    template_form(a, true) == template_form(b, true)
}

/// A ReplicaSet's template (the API requires one; an empty one when it is missing).
pub fn rs_template(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

/// `labelsutil.CloneSelectorAndAddLabel`.
pub fn selector_with_label(sel: &LabelSelector, key: &str, value: &str) -> LabelSelector {
    let mut sel = sel.clone();
    sel.match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
    sel
}

/// `Revision`: the revision annotation (0 when missing; an error when it is not an integer).
pub fn revision(annotations: &Option<BTreeMap<String, String>>) -> Result<i64, String> {
    match annotation(annotations, REVISION) {
        None => Ok(0),
        Some(v) => parse_go_int(v).ok_or_else(|| format!("{REVISION} {v:?} is not an integer")),
    }
}

/// `strconv.ParseInt(s, 10, 64)` (an optional sign, then decimal digits).
fn parse_go_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `MaxRevision`: the highest parsable revision (0 when none).
pub fn max_revision<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i64 {
    rss.into_iter()
        .filter_map(|rs| revision(&rs.metadata.annotations).ok())
        .fold(0, i64::max)
}

/// `LastRevision`: the second highest revision (the one `rollout undo` goes back to).
pub fn last_revision<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i64 {
    let (mut max, mut second) = (0, 0);
    for rs in rss {
        let Ok(v) = revision(&rs.metadata.annotations) else {
            continue;
        };
        if v >= max {
            second = max;
            max = v;
        } else if v > second {
            second = v;
        }
    }
    second
}

/// Whether an annotation is never copied from a Deployment to its ReplicaSets (nor back on a
/// rollback): kubectl's last-applied configuration and the controller's own annotations.
pub fn skip_copy_annotation(key: &str) -> bool {
    matches!(
        key,
        LAST_APPLIED
            | REVISION
            | REVISION_HISTORY
            | DESIRED_REPLICAS
            | MAX_REPLICAS
            | DEPRECATED_ROLLBACK_TO
    )
}

/// `copyDeploymentAnnotationsToReplicaSet`: copies the Deployment's annotations (minus the
/// skipped ones) over the ReplicaSet's; annotations only the ReplicaSet has are kept.
fn copy_deployment_annotations(d: &Deployment, rs: &mut ReplicaSet) -> bool {
    let rs_ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if skip_copy_annotation(k) || rs_ann.get(k) == Some(v) {
            continue;
        }
        rs_ann.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// `SetNewReplicaSetAnnotations`: copies the Deployment's annotations, raises the revision to
/// `new_revision` when it is lower (recording the previous one in `revision-history`, kept under
/// `history_limit` characters by dropping the oldest entries) and, for a ReplicaSet being
/// created, sets desired-replicas and max-replicas. Returns whether anything changed.
pub fn set_new_replica_set_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: &str,
    exists: bool,
    history_limit: usize,
) -> bool {
    let mut changed = copy_deployment_annotations(d, rs);
    let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let old_revision = ann.get(REVISION).cloned();
    let old_int = match old_revision.as_deref() {
        None | Some("") => 0,
        Some(v) => match parse_go_int(v) {
            Some(n) => n,
            // Upstream gives up on the annotations here (and reports no change).
            None => return false,
        },
    };
    let Some(new_int) = parse_go_int(new_revision) else {
        return false;
    };
    if old_int < new_int {
        ann.insert(REVISION.into(), new_revision.into());
        changed = true;
    }
    if let Some(old) = old_revision.filter(|_| old_int < new_int) {
        let history = ann.get(REVISION_HISTORY).cloned().unwrap_or_default();
        let mut entries: Vec<&str> = history.split(',').collect();
        if entries[0].is_empty() {
            ann.insert(REVISION_HISTORY.into(), old);
        } else {
            let mut total = history.len() + old.len() + 1;
            let mut start = 0;
            while total > history_limit && start < entries.len() {
                total -= entries[start].len() + 1;
                start += 1;
            }
            if total <= history_limit {
                entries = entries.split_off(start);
                entries.push(&old);
                ann.insert(REVISION_HISTORY.into(), entries.join(","));
            }
        }
    }
    if !exists && set_replicas_annotations(rs, replicas(d), replicas(d) + max_surge(d)) {
        changed = true;
    }
    changed
}

/// `SetDeploymentAnnotationsTo` (legacy rollback): the Deployment keeps only its skipped
/// annotations and takes the ReplicaSet's others.
pub fn set_deployment_annotations_to(d: &mut Deployment, rs: &ReplicaSet) {
    let mut ann: BTreeMap<String, String> = d
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| skip_copy_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in rs.metadata.annotations.iter().flatten() {
        if !skip_copy_annotation(k) {
            ann.insert(k.clone(), v.clone());
        }
    }
    d.metadata.annotations = Some(ann);
}

/// `SetFromReplicaSetTemplate` (legacy rollback): the Deployment's template becomes the
/// ReplicaSet's, without the pod-template-hash label.
pub fn set_from_replica_set_template(d: &mut Deployment, template: PodTemplateSpec) {
    let mut template = template;
    if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    d.spec.get_or_insert_with(Default::default).template = template;
}

/// `SetDeploymentRevision`: whether the Deployment's revision annotation changed.
pub fn set_deployment_revision(d: &mut Deployment, revision: &str) -> bool {
    let ann = d.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if ann.get(REVISION).map(String::as_str) == Some(revision) {
        return false;
    }
    ann.insert(REVISION.into(), revision.into());
    true
}

/// An annotation read as upstream's `getNonNegativeInt32FromAnnotation` (digits only, at most
/// `i32::MAX`); `None` when missing or not such a number.
fn non_negative_i32_annotation(rs: &ReplicaSet, key: &str) -> Option<i32> {
    let v = annotation(&rs.metadata.annotations, key)?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>()
        .ok()
        .filter(|n| *n <= i32::MAX as u64)
        .map(|n| n as i32)
}

/// `GetDesiredReplicasAnnotation`.
pub fn desired_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    non_negative_i32_annotation(rs, DESIRED_REPLICAS)
}

/// The max-replicas annotation.
pub fn max_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    non_negative_i32_annotation(rs, MAX_REPLICAS)
}

/// `SetReplicasAnnotations`: whether either annotation changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if ann.get(k) != Some(&v) {
            ann.insert(k.into(), v);
            changed = true;
        }
    }
    changed
}

/// `ReplicasAnnotationsNeedUpdate`.
pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    annotation(&rs.metadata.annotations, DESIRED_REPLICAS) != Some(desired.to_string().as_str())
        || annotation(&rs.metadata.annotations, MAX_REPLICAS) != Some(max.to_string().as_str())
}

/// `IsSaturated`: the ReplicaSet is at the Deployment's size, was last scaled for it, and all its
/// Pods are available.
pub fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    let Some(rs) = rs else {
        return false;
    };
    // Upstream reads this one with strconv.Atoi (a sign allowed), unlike the other readers.
    let Some(desired) =
        annotation(&rs.metadata.annotations, DESIRED_REPLICAS).and_then(parse_go_int)
    else {
        return false;
    };
    rs_replicas(rs) == replicas(d)
        && desired as i32 == replicas(d)
        && rs_available(rs) == replicas(d)
}

/// `getReplicaSetFraction`: how many replicas the ReplicaSet gains (or loses) when the
/// Deployment goes from its size at the ReplicaSet's last scaling (max-replicas annotation, else
/// status.replicas) to `replicas + maxSurge` now, rounded half away from zero.
pub fn replica_set_fraction(rs: &ReplicaSet, d: &Deployment) -> i32 {
    if replicas(d) == 0 {
        return -rs_replicas(rs);
    }
    let max_now = replicas(d) + max_surge(d);
    let before = match max_replicas_annotation(rs) {
        Some(n) if n != 0 => n,
        _ => {
            let n = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            if n == 0 {
                return 0;
            }
            n
        }
    };
    let new_size = (i64::from(rs_replicas(rs)) * i64::from(max_now)) as f64 / f64::from(before);
    // integer.RoundToInt32: math.Round, half away from zero.
    new_size.round() as i32 - rs_replicas(rs)
}

/// `GetReplicaSetProportion`: the ReplicaSet's share of `to_add`, never beyond what is left of
/// it after `added`.
pub fn replica_set_proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = replica_set_fraction(rs, d);
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// `NewRSNewReplicas`: the new ReplicaSet's size this step. RollingUpdate: up by what maxSurge
/// leaves above the ReplicaSets' total, never past spec.replicas; Recreate: spec.replicas.
pub fn new_rs_new_replicas(
    d: &Deployment,
    all: &[&ReplicaSet],
    new_rs: &ReplicaSet,
) -> Result<i32, String> {
    match strategy_type(d) {
        "RollingUpdate" => {
            let zero = IntOrString::Int(0);
            let surge = rolling_update(d)
                .and_then(|r| r.max_surge.as_ref())
                .unwrap_or(&zero);
            let surge = scaled_value(surge, replicas(d), true)?;
            let current = replica_count(all.iter().copied());
            let max_total = replicas(d) + surge;
            if current >= max_total {
                return Ok(rs_replicas(new_rs));
            }
            let up = (max_total - current).min(replicas(d) - rs_replicas(new_rs));
            Ok(rs_replicas(new_rs) + up)
        }
        "Recreate" => Ok(replicas(d)),
        other => Err(format!("deployment type {other:?} isn't supported")),
    }
}

/// Sum of `spec.replicas` (`GetReplicaCountForReplicaSets`).
pub fn replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_replicas).sum()
}

/// Sum of `status.replicas` (`GetActualReplicaCountForReplicaSets`).
pub fn actual_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_status_replicas).sum()
}

/// Sum of `status.readyReplicas`.
pub fn ready_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_ready).sum()
}

/// Sum of `status.availableReplicas`.
pub fn available_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_available).sum()
}

/// `ReplicaSetsByCreationTimestamp`: older first, then by name.
pub fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    a.metadata
        .creation_timestamp
        .cmp(&b.metadata.creation_timestamp)
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// `ReplicaSetsBySizeOlder`: larger first, then older first (scaling down).
pub fn by_size_older(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    rs_replicas(b)
        .cmp(&rs_replicas(a))
        .then_with(|| by_creation(a, b))
}

/// `ReplicaSetsBySizeNewer`: larger first, then newer first (scaling up).
pub fn by_size_newer(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    rs_replicas(b)
        .cmp(&rs_replicas(a))
        .then_with(|| by_creation(b, a))
}

/// `ReplicaSetsByRevision`: lower revision first; unparsable or equal revisions by creation.
pub fn by_revision(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    match (
        revision(&a.metadata.annotations),
        revision(&b.metadata.annotations),
    ) {
        (Ok(x), Ok(y)) if x != y => x.cmp(&y),
        _ => by_creation(a, b),
    }
}

/// `HasProgressDeadline`: set and not `i32::MAX` (the "no deadline" value).
pub fn has_progress_deadline(d: &Deployment) -> bool {
    progress_deadline(d).is_some()
}

/// progressDeadlineSeconds when it counts.
pub fn progress_deadline(d: &Deployment) -> Option<i32> {
    d.spec
        .as_ref()?
        .progress_deadline_seconds
        .filter(|s| *s != i32::MAX)
}

/// revisionHistoryLimit when it counts (set and not `i32::MAX`).
pub fn revision_history_limit(d: &Deployment) -> Option<i32> {
    d.spec
        .as_ref()?
        .revision_history_limit
        .filter(|s| *s != i32::MAX)
}

/// `NewDeploymentCondition` at `now`.
pub fn new_condition(
    ty: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: ty.into(),
        status: status.into(),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
        reason: Some(reason.into()),
        message: Some(message),
    }
}

/// `GetDeploymentCondition`.
pub fn get_condition<'a>(
    status: &'a DeploymentStatus,
    ty: &str,
) -> Option<&'a DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == ty)
}

/// The condition of a Deployment's current status.
pub fn condition_of<'a>(d: &'a Deployment, ty: &str) -> Option<&'a DeploymentCondition> {
    d.status.as_ref().and_then(|s| get_condition(s, ty))
}

/// `SetDeploymentCondition`: no change when status and reason are the same; otherwise the
/// condition replaces the old one (moved to the end), keeping its transition time when the status
/// did not change.
pub fn set_condition(status: &mut DeploymentStatus, mut cond: DeploymentCondition) {
    if let Some(cur) = get_condition(status, &cond.type_) {
        if cur.status == cond.status && cur.reason == cond.reason {
            return;
        }
        if cur.status == cond.status {
            cond.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_condition(status, &cond.type_);
    status.conditions.get_or_insert_with(Vec::new).push(cond);
}

/// `RemoveDeploymentCondition`.
pub fn remove_condition(status: &mut DeploymentStatus, ty: &str) {
    if let Some(conds) = status.conditions.as_mut() {
        conds.retain(|c| c.type_ != ty);
        if conds.is_empty() {
            status.conditions = None;
        }
    }
}

/// `ReplicaSetToDeploymentCondition`.
pub fn replica_set_to_deployment_condition(c: &ReplicaSetCondition) -> DeploymentCondition {
    DeploymentCondition {
        type_: c.type_.clone(),
        status: c.status.clone(),
        last_transition_time: c.last_transition_time.clone(),
        last_update_time: c.last_transition_time.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
    }
}

fn generation(d: &Deployment) -> i64 {
    d.metadata.generation.unwrap_or(0)
}

/// `DeploymentComplete`: every replica updated and available, and the latest spec observed.
pub fn deployment_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let n = replicas(d);
    status.updated_replicas.unwrap_or(0) == n
        && status.replicas.unwrap_or(0) == n
        && status.available_replicas.unwrap_or(0) == n
        && status.observed_generation.unwrap_or(0) >= generation(d)
}

/// `DeploymentProgressing`: compared with the Deployment's current status, more updated, ready
/// or available replicas, or fewer old ones.
pub fn deployment_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let get = |v: Option<i32>| v.unwrap_or(0);
    let old_old = get(old.replicas) - get(old.updated_replicas);
    let new_old = get(new.replicas) - get(new.updated_replicas);
    get(new.updated_replicas) > get(old.updated_replicas)
        || new_old < old_old
        || get(new.ready_replicas) > get(old.ready_replicas)
        || get(new.available_replicas) > get(old.available_replicas)
}

/// `DeploymentTimedOut`: the Progressing condition of `new` was last updated more than
/// progressDeadlineSeconds before `now` (and the rollout is not complete).
pub fn deployment_timed_out(d: &Deployment, new: &DeploymentStatus, now: Timestamp) -> bool {
    let Some(deadline) = progress_deadline(d) else {
        return false;
    };
    let Some(cond) = get_condition(new, PROGRESSING) else {
        return false;
    };
    match cond.reason.as_deref() {
        Some(REASON_NEW_RS_AVAILABLE) => return false,
        Some(REASON_TIMED_OUT) => return true,
        _ => {}
    }
    let from = cond
        .last_update_time
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    from + SignedDuration::from_secs(i64::from(deadline)) < now
}

/// Whether `rs` is controlled by the object with `uid`.
pub fn controlled_by(rs: &ReplicaSet, uid: &str) -> bool {
    crate::runtime::informer::controller_uid(rs) == Some(uid)
}

#[cfg(test)]
#[path = "util_tests.rs"]
mod tests;
