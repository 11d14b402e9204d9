//! The Deployment plan: from a Deployment, the ReplicaSets it controls (already claimed) and their
//! Pods, the API writes one sync makes, in order. Pure: the apply layer in `super` executes the
//! actions and reads nothing back into the plan.
//!
//! The plan follows kube-controller-manager v1.34's `syncDeployment` step by step (DEP-3):
//! deleting → status only; the paused / resumed condition; paused → `sync` (scale and clean up);
//! the legacy rollback annotation → `rollback`; a scaling event (DEP-4, the desired-replicas
//! annotation) → `sync`; otherwise `rolloutRecreate` or `rolloutRolling`. Upstream writes as it
//! goes and continues with the objects it wrote; the plan does the same on working copies (the
//! Deployment and its ReplicaSets) so later steps see earlier writes. Two consequences differ,
//! on purpose, from upstream's code: upstream re-reads some stale cached copies within one sync
//! and so sends a second update that fails with a conflict and requeues the Deployment, while the
//! plan continues from its working copies (the same writes, without the failed round trip); and
//! the apply layer sends each write with the resourceVersion the previous write of the same object
//! returned, where upstream reuses the cached one and conflicts.

use std::collections::HashMap;
use std::iter;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::Value;

use super::util::*;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::claim::OwnerInfo;

/// What one sync reads: everything comes from the informers' caches.
pub struct Input<'a> {
    /// The Deployment, as cached.
    pub deployment: &'a Deployment,
    /// The ReplicaSets it controls after claiming (`getReplicaSetsForDeployment`).
    pub replica_sets: &'a [Arc<ReplicaSet>],
    /// Its Pods by controlling ReplicaSet uid (`getPodMapForDeployment`: every claimed
    /// ReplicaSet has an entry; inactive Pods included, Recreate waits for them).
    pub pods: &'a HashMap<String, Vec<Arc<CachedPod>>>,
    /// Any ReplicaSet of the namespace by name: a name taken by a ReplicaSet with another
    /// template is a pod-template-hash collision.
    pub replica_set_named: &'a dyn Fn(&str) -> Option<Arc<ReplicaSet>>,
    /// The time of the sync.
    pub now: Timestamp,
}

/// One API write (or event) of a sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the new ReplicaSet. `deployment` is the Deployment as it stands before the create:
    /// if the create fails, [`create_failed`] derives the status to report from it.
    CreateReplicaSet {
        /// The ReplicaSet to create.
        rs: Box<ReplicaSet>,
        /// The working Deployment at this point.
        deployment: Box<Deployment>,
    },
    /// Replace a ReplicaSet (scale it, or update its annotations / minReadySeconds).
    UpdateReplicaSet(Box<ReplicaSet>),
    /// Delete an old ReplicaSet (revision history cleanup).
    DeleteReplicaSet {
        /// Its name.
        name: String,
    },
    /// Replace the Deployment's status (the status subresource also takes its annotations,
    /// which is how the revision annotation reaches the Deployment).
    UpdateStatus {
        /// The whole Deployment.
        deployment: Box<Deployment>,
        /// A failure is ignored (upstream drops the error of these writes).
        best_effort: bool,
    },
    /// Replace the Deployment itself (the legacy rollback: template, annotations).
    UpdateDeployment(Box<Deployment>),
    /// Record an event on the Deployment.
    Event {
        /// Warning rather than Normal.
        warning: bool,
        /// Upstream's reason.
        reason: &'static str,
        /// Upstream's message.
        message: String,
    },
}

/// When the Deployment must be synced again without a watch event (the progress deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// After this long.
    After(Duration),
    /// Now, through the rate limiter.
    RateLimited,
}

/// What one sync does.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// The writes, in order; the apply layer stops at the first that fails.
    pub actions: Vec<Action>,
    /// The error the sync ends with once the actions are done (the key is retried).
    pub error: Option<String>,
    /// A delayed resync to check the progress deadline.
    pub requeue: Option<Requeue>,
}

/// The reason an event or message is about.
const EVENT_SCALING: &str = "ScalingReplicaSet";

/// The plan for a Deployment whose selector is empty (`{}`): nothing is claimed or scaled (a
/// Deployment may not select every Pod); a warning, and observedGeneration catches up.
pub fn selecting_all(d: &Deployment) -> Option<Plan> {
    let sel = &d.spec.as_ref()?.selector;
    let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    if !empty {
        return None;
    }
    let mut plan = Plan::default();
    plan.actions.push(Action::Event {
        warning: true,
        reason: "SelectingAll",
        message: "This deployment is selecting all pods. A non-empty selector is required.".into(),
    });
    let generation = d.metadata.generation.unwrap_or(0);
    let status = d.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < generation {
        let mut d = d.clone();
        d.status
            .get_or_insert_with(Default::default)
            .observed_generation = Some(generation);
        plan.actions.push(Action::UpdateStatus {
            deployment: Box::new(d),
            best_effort: true,
        });
    }
    Some(plan)
}

/// Plans one sync of a Deployment that does not select everything (see [`selecting_all`]).
pub fn plan(input: &Input<'_>) -> Plan {
    let mut p = Planner::new(input);
    let result = p.sync_deployment();
    let mut plan = p.out;
    if let Err(Stop(e)) = result {
        plan.error = Some(e);
    }
    plan
}

/// What the apply layer writes when creating the new ReplicaSet failed with `error`: the
/// Progressing condition ReplicaSetCreateError (when the Deployment has a progress deadline; a
/// failure of that write is ignored) and a warning event.
pub fn create_failed(d: &Deployment, rs_name: &str, error: &str, now: Timestamp) -> Vec<Action> {
    let msg = format!("Failed to create new replica set {rs_name:?}: {error}");
    let mut actions = Vec::new();
    if has_progress_deadline(d) {
        let mut d = d.clone();
        let now = seconds(now);
        set_condition(
            d.status.get_or_insert_with(Default::default),
            new_condition(
                PROGRESSING,
                "False",
                REASON_RS_CREATE_ERROR,
                msg.clone(),
                &now,
            ),
        );
        actions.push(Action::UpdateStatus {
            deployment: Box::new(d),
            best_effort: true,
        });
    }
    actions.push(Action::Event {
        warning: true,
        reason: REASON_RS_CREATE_ERROR,
        message: msg,
    });
    actions
}

/// Condition times are stored with second precision; the plan stamps them so.
fn seconds(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A known error that ends the sync (after the actions planned so far).
struct Stop(String);

type Step<T> = Result<T, Stop>;

/// The legacy rollback request (`getRollbackTo`): the annotation's revision, when it is an
/// integer.
fn rollback_to(d: &Deployment) -> Option<i64> {
    let v = d
        .metadata
        .annotations
        .as_ref()?
        .get(DEPRECATED_ROLLBACK_TO)?;
    if v.is_empty() {
        return None;
    }
    v.parse().ok()
}

fn paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
}

fn min_ready_seconds(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.min_ready_seconds)
}

/// The status with the zero values the API server leaves out (omitempty) left out, so that a
/// computed status compares equal to the one read back.
fn normalized(s: Option<&DeploymentStatus>) -> DeploymentStatus {
    let mut s = s.cloned().unwrap_or_default();
    for v in [
        &mut s.replicas,
        &mut s.updated_replicas,
        &mut s.ready_replicas,
        &mut s.available_replicas,
        &mut s.unavailable_replicas,
    ] {
        if *v == Some(0) {
            *v = None;
        }
    }
    if s.observed_generation == Some(0) {
        s.observed_generation = None;
    }
    if s.conditions.as_ref().is_some_and(Vec::is_empty) {
        s.conditions = None;
    }
    s
}

fn nonzero(v: i32) -> Option<i32> {
    (v != 0).then_some(v)
}

struct Planner<'a, 'b> {
    input: &'b Input<'a>,
    /// The working Deployment (defaults applied, writes of this sync applied).
    d: Deployment,
    /// The working ReplicaSets, by creation time (the order upstream's first
    /// `FindNewReplicaSet` leaves its list in); a ReplicaSet created by the plan is appended.
    rss: Vec<ReplicaSet>,
    /// Each working ReplicaSet's template as compared ([`template_form`], hash label left out).
    forms: Vec<Value>,
    /// The time of the sync, exact.
    now: Timestamp,
    /// The time of the sync as stored in conditions.
    stamp: Time,
    out: Plan,
}

impl<'a, 'b> Planner<'a, 'b> {
    fn new(input: &'b Input<'a>) -> Self {
        let mut rss: Vec<ReplicaSet> = input.replica_sets.iter().map(|rs| (**rs).clone()).collect();
        rss.sort_by(by_creation);
        let forms = rss
            .iter()
            .map(|rs| template_form(&rs_template(rs), true))
            .collect();
        Planner {
            input,
            d: with_defaults(input.deployment),
            rss,
            forms,
            now: input.now,
            stamp: seconds(input.now),
            out: Plan::default(),
        }
    }

    // --- writes -------------------------------------------------------------------------------

    fn write_status(&mut self) {
        self.out.actions.push(Action::UpdateStatus {
            deployment: Box::new(self.d.clone()),
            best_effort: false,
        });
    }

    fn write_rs(&mut self, i: usize) {
        self.out
            .actions
            .push(Action::UpdateReplicaSet(Box::new(self.rss[i].clone())));
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: String) {
        self.out.actions.push(Action::Event {
            warning,
            reason,
            message,
        });
    }

    fn status_mut(&mut self) -> &mut DeploymentStatus {
        self.d.status.get_or_insert_with(Default::default)
    }

    fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    fn name(&self) -> String {
        self.d.name_any()
    }

    fn rs_list(&self, idx: &[usize]) -> Vec<&ReplicaSet> {
        idx.iter().map(|&i| &self.rss[i]).collect()
    }

    fn active(&self, idx: impl IntoIterator<Item = usize>) -> Vec<usize> {
        idx.into_iter()
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect()
    }

    // --- syncDeployment -----------------------------------------------------------------------

    fn sync_deployment(&mut self) -> Step<()> {
        if self.d.metadata.deletion_timestamp.is_some() {
            return self.sync_status_only();
        }
        self.check_paused_conditions();
        if paused(&self.d) {
            return self.sync();
        }
        // The legacy rollback: apps/v1 has no spec.rollbackTo (kubectl rollout undo patches
        // the template instead, found again by FindNewReplicaSet), but v1.34 still acts on the
        // annotation that carried the removed field, so the plan does too.
        if rollback_to(&self.d).is_some() {
            return self.rollback();
        }
        if self.is_scaling_event()? {
            return self.sync();
        }
        match strategy_type(&self.d) {
            "Recreate" => self.rollout_recreate(),
            "RollingUpdate" => self.rollout_rolling(),
            other => Err(Stop(format!(
                "spec.strategy.type {other:?} is neither Recreate nor RollingUpdate"
            ))),
        }
    }

    /// `syncStatusOnly` (a Deployment being deleted).
    fn sync_status_only(&mut self) -> Step<()> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(false)?;
        let all: Vec<usize> = old.iter().copied().chain(new).collect();
        self.sync_deployment_status(&all, new);
        Ok(())
    }

    /// `sync` (DEP-5): scaling events and paused Deployments.
    fn sync(&mut self) -> Step<()> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(false)?;
        self.scale(new, &old);
        if paused(&self.d) && rollback_to(&self.d).is_none() {
            self.cleanup_deployment(&old);
        }
        let all: Vec<usize> = old.iter().copied().chain(new).collect();
        self.sync_deployment_status(&all, new);
        Ok(())
    }

    /// `checkPausedConditions` (DEP-16): an Unknown Progressing condition while paused, and on
    /// resume, so the time spent paused never counts against the progress deadline.
    fn check_paused_conditions(&mut self) {
        if !has_progress_deadline(&self.d) {
            return;
        }
        let reason = condition_of(&self.d, PROGRESSING).and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(REASON_TIMED_OUT) {
            return;
        }
        let paused_cond = reason.as_deref() == Some(REASON_PAUSED);
        let cond = match (paused(&self.d), paused_cond) {
            (true, false) => (REASON_PAUSED, "Deployment is paused"),
            (false, true) => (REASON_RESUMED, "Deployment is resumed"),
            _ => return,
        };
        let c = new_condition(PROGRESSING, "Unknown", cond.0, cond.1.into(), &self.stamp);
        set_condition(self.status_mut(), c);
        self.write_status();
    }

    /// `isScalingEvent` (DEP-4): an active ReplicaSet was last scaled for another spec.replicas.
    fn is_scaling_event(&mut self) -> Step<bool> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(false)?;
        let want = replicas(&self.d);
        Ok(self
            .active(old.into_iter().chain(new))
            .into_iter()
            .filter_map(|i| desired_replicas_annotation(&self.rss[i]))
            .any(|desired| desired != want))
    }

    // --- new and old ReplicaSets --------------------------------------------------------------

    /// `FindNewReplicaSet` (DEP-15): the oldest ReplicaSet whose template is the Deployment's,
    /// ignoring the pod-template-hash label.
    fn find_new_replica_set(&self) -> Option<usize> {
        let want = template_form(&self.d.spec.clone().unwrap_or_default().template, true);
        self.forms.iter().position(|f| *f == want)
    }

    /// `getAllReplicaSetsAndSyncRevision`: (new, old) ReplicaSets, the new one's revision
    /// synced, created when `create` and missing.
    fn get_all_replica_sets_and_sync_revision(
        &mut self,
        create: bool,
    ) -> Step<(Option<usize>, Vec<usize>)> {
        let existing = self.find_new_replica_set();
        let old: Vec<usize> = (0..self.rss.len())
            .filter(|i| Some(*i) != existing)
            .collect();
        let new = self.get_new_replica_set(existing, &old, create)?;
        Ok((new, old))
    }

    /// `getNewReplicaSet` (DEP-1, DEP-15): an existing new ReplicaSet gets the highest revision
    /// (max of the old ones + 1, the old revision going to revision-history) and the
    /// Deployment's annotations; otherwise, when `create`, it is created as
    /// `<deployment>-<hash>`.
    fn get_new_replica_set(
        &mut self,
        existing: Option<usize>,
        old: &[usize],
        create: bool,
    ) -> Step<Option<usize>> {
        let max_old = max_revision(self.rs_list(old));
        let new_revision = (max_old + 1).to_string();
        if let Some(i) = existing {
            let mut copy = self.rss[i].clone();
            let annotations_updated = set_new_replica_set_annotations(
                &self.d,
                &mut copy,
                &new_revision,
                true,
                MAX_REVISION_HISTORY_CHARS,
            );
            let want_min_ready = min_ready_seconds(&self.d);
            let spec = copy.spec.get_or_insert_with(Default::default);
            let min_ready_needs_update =
                spec.min_ready_seconds.unwrap_or(0) != want_min_ready.unwrap_or(0);
            if annotations_updated || min_ready_needs_update {
                spec.min_ready_seconds = want_min_ready;
                self.rss[i] = copy;
                self.write_rs(i);
                return Ok(Some(i));
            }
            let rev = copy
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION))
                .cloned()
                .unwrap_or_default();
            let name = copy.name_any();
            self.rss[i] = copy;
            let mut needs_update = set_deployment_revision(&mut self.d, &rev);
            if has_progress_deadline(&self.d) && condition_of(&self.d, PROGRESSING).is_none() {
                let c = new_condition(
                    PROGRESSING,
                    "True",
                    REASON_FOUND_NEW_RS,
                    format!("Found new replica set {name:?}"),
                    &self.stamp,
                );
                set_condition(self.status_mut(), c);
                needs_update = true;
            }
            if needs_update {
                self.write_status();
            }
            return Ok(Some(i));
        }
        if !create {
            return Ok(None);
        }
        self.create_new_replica_set(old, &new_revision).map(Some)
    }

    /// The create half of `getNewReplicaSet`, with its hash-collision handling.
    fn create_new_replica_set(&mut self, old: &[usize], new_revision: &str) -> Step<usize> {
        let spec = self.d.spec.clone().unwrap_or_default();
        let collision_count = self.status().collision_count;
        let hash = compute_hash(&spec.template, collision_count);
        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
        let name = replica_set_name(&self.name(), &hash);
        let namespace = self.d.namespace().unwrap_or_default();
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                owner_references: Some(vec![OwnerInfo::of(&self.d).controller_ref()]),
                labels,
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector: selector_with_label(&spec.selector, POD_TEMPLATE_HASH, &hash),
                template: Some(template),
            }),
            status: None,
        };
        let all: Vec<&ReplicaSet> = old
            .iter()
            .map(|&i| &self.rss[i])
            .chain(iter::once(&rs))
            .collect();
        let count = new_rs_new_replicas(&self.d, &all, &rs)
            .map_err(|e| Stop(format!("spec.strategy.rollingUpdate.maxSurge: {e}")))?;
        set_rs_replicas(&mut rs, count);
        set_new_replica_set_annotations(
            &self.d,
            &mut rs,
            new_revision,
            false,
            MAX_REVISION_HISTORY_CHARS,
        );

        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let (idx, already_exists) = match (self.input.replica_set_named)(&name) {
            Some(found)
                if controlled_by(&found, &uid)
                    && equal_ignore_hash(&spec.template, &rs_template(&found)) =>
            {
                // Ours after all (our own earlier create, not yet claimed): use it.
                let idx = match self.rss.iter().position(|r| r.name_any() == name) {
                    Some(i) => i,
                    None => self.push_rs((*found).clone()),
                };
                (idx, true)
            }
            Some(_) => {
                // Another template under this name: a hash collision. The next sync hashes
                // with the raised collisionCount and so picks another name.
                let bumped = collision_count.unwrap_or(0) + 1;
                self.status_mut().collision_count = Some(bumped);
                self.write_status();
                return Err(Stop(format!(
                    "ReplicaSet {namespace}/{name} already exists with another template \
                     (pod-template-hash collision); status.collisionCount raised to {bumped}"
                )));
            }
            None => {
                self.out.actions.push(Action::CreateReplicaSet {
                    rs: Box::new(rs.clone()),
                    deployment: Box::new(self.d.clone()),
                });
                rs.metadata.creation_timestamp = Some(self.stamp.clone());
                (self.push_rs(rs), false)
            }
        };
        if !already_exists && count > 0 {
            self.event(
                false,
                EVENT_SCALING,
                format!("Scaled up replica set {name} from 0 to {count}"),
            );
        }
        let mut needs_update = set_deployment_revision(&mut self.d, new_revision);
        if !already_exists && has_progress_deadline(&self.d) {
            let c = new_condition(
                PROGRESSING,
                "True",
                REASON_NEW_RS_CREATED,
                format!("Created new replica set {name:?}"),
                &self.stamp,
            );
            set_condition(self.status_mut(), c);
            needs_update = true;
        }
        if needs_update {
            self.write_status();
        }
        Ok(idx)
    }

    fn push_rs(&mut self, rs: ReplicaSet) -> usize {
        self.forms.push(template_form(&rs_template(&rs), true));
        self.rss.push(rs);
        self.rss.len() - 1
    }

    // --- scaling ------------------------------------------------------------------------------

    /// `FindActiveOrLatest`: the only active ReplicaSet; with none active, the new one or else
    /// the newest old one; with several active, none.
    fn find_active_or_latest(&self, new: Option<usize>, old: &[usize]) -> Option<usize> {
        if new.is_none() && old.is_empty() {
            return None;
        }
        let mut old = old.to_vec();
        old.sort_by(|&a, &b| by_creation(&self.rss[b], &self.rss[a]));
        let active = self.active(old.iter().copied().chain(new));
        match active.len() {
            // The new one, else the newest old one (lazily: with no old ReplicaSet there is no
            // old[0], and a new one is then always there).
            0 => new.or_else(|| old.first().copied()),
            1 => Some(active[0]),
            _ => None,
        }
    }

    /// `scale` (DEP-6): one active ReplicaSet takes spec.replicas; a saturated new one leaves the
    /// old ones at 0; otherwise (RollingUpdate) the change is shared in proportion to the
    /// ReplicaSets' sizes, the rounding leftover going to the first in the scaling order.
    fn scale(&mut self, new: Option<usize>, old: &[usize]) {
        let want = replicas(&self.d);
        if let Some(i) = self.find_active_or_latest(new, old) {
            if rs_replicas(&self.rss[i]) != want {
                self.scale_replica_set_and_record_event(i, want);
            }
            return;
        }
        if is_saturated(&self.d, new.map(|i| &self.rss[i])) {
            for i in self.active(old.iter().copied()) {
                self.scale_replica_set_and_record_event(i, 0);
            }
            return;
        }
        if !is_rolling_update(&self.d) {
            return;
        }
        let mut all = self.active(old.iter().copied().chain(new));
        let total = replica_count(self.rs_list(&all));
        let allowed = if want > 0 {
            want + max_surge(&self.d)
        } else {
            0
        };
        let to_add = allowed - total;
        if to_add > 0 {
            all.sort_by(|&a, &b| by_size_newer(&self.rss[a], &self.rss[b]));
        } else if to_add < 0 {
            all.sort_by(|&a, &b| by_size_older(&self.rss[a], &self.rss[b]));
        }
        let mut added = 0;
        let mut sizes = Vec::with_capacity(all.len());
        for &i in &all {
            let rs = &self.rss[i];
            if to_add != 0 {
                let p = replica_set_proportion(rs, &self.d, to_add, added);
                sizes.push(rs_replicas(rs) + p);
                added += p;
            } else {
                sizes.push(rs_replicas(rs));
            }
        }
        for (k, &i) in all.iter().enumerate() {
            if k == 0 && to_add != 0 {
                sizes[0] = (sizes[0] + to_add - added).max(0);
            }
            self.scale_replica_set(i, sizes[k]);
        }
    }

    /// `scaleReplicaSetAndRecordEvent`: scales unless already at `n`.
    fn scale_replica_set_and_record_event(&mut self, i: usize, n: i32) -> bool {
        if rs_replicas(&self.rss[i]) == n {
            return false;
        }
        self.scale_replica_set(i, n)
    }

    /// `scaleReplicaSet` (DEP-7): writes size and the desired / max replicas annotations when
    /// either is stale; whether the size changed.
    fn scale_replica_set(&mut self, i: usize, n: i32) -> bool {
        let desired = replicas(&self.d);
        let max = desired + max_surge(&self.d);
        let rs = &mut self.rss[i];
        let from = rs_replicas(rs);
        let size_changes = from != n;
        if !size_changes && !replicas_annotations_need_update(rs, desired, max) {
            return false;
        }
        set_rs_replicas(rs, n);
        set_replicas_annotations(rs, desired, max);
        let name = rs.name_any();
        self.write_rs(i);
        if size_changes {
            let dir = if from < n { "up" } else { "down" };
            self.event(
                false,
                EVENT_SCALING,
                format!("Scaled {dir} replica set {name} from {from} to {n}"),
            );
        }
        size_changes
    }

    /// `cleanupDeployment` (DEP-14): beyond revisionHistoryLimit, delete the lowest revisions
    /// among old ReplicaSets that are fully scaled down, observed and not being deleted.
    fn cleanup_deployment(&mut self, old: &[usize]) {
        let Some(limit) = revision_history_limit(&self.d) else {
            return;
        };
        let mut cleanable: Vec<usize> = old
            .iter()
            .copied()
            .filter(|&i| self.rss[i].metadata.deletion_timestamp.is_none())
            .collect();
        let diff = cleanable.len() as i64 - i64::from(limit);
        if diff <= 0 {
            return;
        }
        // v1.34 orders by revision (creation time breaks ties), not by creation time alone.
        cleanable.sort_by(|&a, &b| by_revision(&self.rss[a], &self.rss[b]));
        for &i in cleanable.iter().take(diff as usize) {
            let rs = &self.rss[i];
            let observed = rs
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0);
            if rs_status_replicas(rs) != 0
                || rs_replicas(rs) != 0
                || rs.metadata.generation.unwrap_or(0) > observed
                || rs.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            self.out.actions.push(Action::DeleteReplicaSet {
                name: rs.name_any(),
            });
        }
    }

    // --- status -------------------------------------------------------------------------------

    /// `calculateStatus`: the counts summed over the ReplicaSets, and the Available condition.
    fn calculate_status(&self, all: &[usize], new: Option<usize>) -> DeploymentStatus {
        let rss = self.rs_list(all);
        let available = available_replica_count(rss.iter().copied());
        let total = replica_count(rss.iter().copied());
        let old = self.status();
        let mut status = DeploymentStatus {
            observed_generation: self.d.metadata.generation.filter(|g| *g != 0),
            replicas: nonzero(actual_replica_count(rss.iter().copied())),
            updated_replicas: nonzero(actual_replica_count(new.map(|i| &self.rss[i]))),
            ready_replicas: nonzero(ready_replica_count(rss.iter().copied())),
            available_replicas: nonzero(available),
            unavailable_replicas: nonzero((total - available).max(0)),
            collision_count: old.collision_count,
            // DeploymentReplicaSetTerminatingReplicas is alpha and off in v1.34.
            terminating_replicas: None,
            conditions: old.conditions.clone().filter(|c| !c.is_empty()),
        };
        let c = if available >= replicas(&self.d) - max_unavailable(&self.d) {
            new_condition(
                AVAILABLE,
                "True",
                REASON_MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
                &self.stamp,
            )
        } else {
            new_condition(
                AVAILABLE,
                "False",
                REASON_MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                &self.stamp,
            )
        };
        set_condition(&mut status, c);
        status
    }

    /// `syncDeploymentStatus`: writes the status when it changed.
    fn sync_deployment_status(&mut self, all: &[usize], new: Option<usize>) {
        let status = self.calculate_status(all, new);
        if normalized(self.d.status.as_ref()) == normalized(Some(&status)) {
            return;
        }
        self.d.status = Some(status);
        self.write_status();
    }

    /// `syncRolloutStatus` (DEP-18): the status plus the Progressing condition (complete,
    /// progressing, or past its deadline) and the ReplicaSets' ReplicaFailure; an unchanged status
    /// schedules the deadline check instead.
    fn sync_rollout_status(&mut self, all: &[usize], new: Option<usize>) {
        let mut status = self.calculate_status(all, new);
        let deadline = has_progress_deadline(&self.d);
        if !deadline {
            remove_condition(&mut status, PROGRESSING);
        }
        let current = condition_of(&self.d, PROGRESSING).cloned();
        let complete_already = status.replicas.unwrap_or(0) == status.updated_replicas.unwrap_or(0)
            && current.as_ref().and_then(|c| c.reason.as_deref()) == Some(REASON_NEW_RS_AVAILABLE);
        if deadline && !complete_already {
            let subject = match new {
                Some(i) => format!("ReplicaSet {:?}", self.rss[i].name_any()),
                None => format!("Deployment {:?}", self.name()),
            };
            if deployment_complete(&self.d, &status) {
                let c = new_condition(
                    PROGRESSING,
                    "True",
                    REASON_NEW_RS_AVAILABLE,
                    format!("{subject} has successfully progressed."),
                    &self.stamp,
                );
                set_condition(&mut status, c);
            } else if deployment_progressing(&self.d, &status) {
                let mut c = new_condition(
                    PROGRESSING,
                    "True",
                    REASON_RS_UPDATED,
                    format!("{subject} is progressing."),
                    &self.stamp,
                );
                // Progress moves lastUpdateTime even when the reason stays ReplicaSetUpdated
                // (set_condition alone would keep the old condition).
                if let Some(cur) = &current {
                    if cur.status == "True" {
                        c.last_transition_time = cur.last_transition_time.clone();
                    }
                    remove_condition(&mut status, PROGRESSING);
                }
                set_condition(&mut status, c);
            } else if deployment_timed_out(&self.d, &status, self.now) {
                let c = new_condition(
                    PROGRESSING,
                    "False",
                    REASON_TIMED_OUT,
                    format!("{subject} has timed out progressing."),
                    &self.stamp,
                );
                set_condition(&mut status, c);
            }
        }
        match self.replica_failure(all, new) {
            Some(c) => set_condition(&mut status, c),
            None => remove_condition(&mut status, REPLICA_FAILURE),
        }
        if normalized(self.d.status.as_ref()) == normalized(Some(&status)) {
            self.requeue_stuck_deployment(&status);
            return;
        }
        self.d.status = Some(status);
        self.write_status();
    }

    /// `getReplicaFailures`: the new ReplicaSet's ReplicaFailure condition, else the first old
    /// one's.
    fn replica_failure(&self, all: &[usize], new: Option<usize>) -> Option<DeploymentCondition> {
        let failure = |i: usize| {
            self.rss[i]
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .find(|c| c.type_ == REPLICA_FAILURE)
                .map(replica_set_to_deployment_condition)
        };
        new.and_then(failure)
            .or_else(|| all.iter().find_map(|&i| failure(i)))
    }

    /// `requeueStuckDeployment`: a rollout in progress is checked again when its progress
    /// deadline passes (plus a second against clock skew; at once if less than a second is
    /// left).
    fn requeue_stuck_deployment(&mut self, status: &DeploymentStatus) {
        let Some(deadline) = progress_deadline(&self.d) else {
            return;
        };
        let Some(cur) = condition_of(&self.d, PROGRESSING) else {
            return;
        };
        if deployment_complete(&self.d, status) || cur.reason.as_deref() == Some(REASON_TIMED_OUT) {
            return;
        }
        let from = cur
            .last_update_time
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
        let after =
            (from + SignedDuration::from_secs(i64::from(deadline))).duration_since(self.now);
        self.out.requeue = Some(if after < SignedDuration::from_secs(1) {
            Requeue::RateLimited
        } else {
            Requeue::After(
                Duration::try_from(after + SignedDuration::from_secs(1))
                    .unwrap_or(Duration::from_secs(1)),
            )
        });
    }

    // --- rollouts -----------------------------------------------------------------------------

    /// `rolloutRolling` (DEP-10): scale the new ReplicaSet up, else the old ones down, else
    /// (complete) clean up; then the rollout status.
    fn rollout_rolling(&mut self) -> Step<()> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(true)?;
        let new = new.expect("a ReplicaSet is created when missing");
        let all: Vec<usize> = old.iter().copied().chain(iter::once(new)).collect();
        if self.reconcile_new_replica_set(&all, new)? {
            self.sync_rollout_status(&all, Some(new));
            return Ok(());
        }
        let active_old = self.active(old.iter().copied());
        if self.reconcile_old_replica_sets(&all, active_old, new) {
            self.sync_rollout_status(&all, Some(new));
            return Ok(());
        }
        if deployment_complete(&self.d, &self.status()) {
            self.cleanup_deployment(&old);
        }
        self.sync_rollout_status(&all, Some(new));
        Ok(())
    }

    /// `reconcileNewReplicaSet` (DEP-11).
    fn reconcile_new_replica_set(&mut self, all: &[usize], new: usize) -> Step<bool> {
        let want = replicas(&self.d);
        let have = rs_replicas(&self.rss[new]);
        if have == want {
            return Ok(false);
        }
        if have > want {
            return Ok(self.scale_replica_set_and_record_event(new, want));
        }
        let n = new_rs_new_replicas(&self.d, &self.rs_list(all), &self.rss[new])
            .map_err(|e| Stop(format!("spec.strategy.rollingUpdate.maxSurge: {e}")))?;
        Ok(self.scale_replica_set_and_record_event(new, n))
    }

    /// `reconcileOldReplicaSets` (DEP-12): how far the old ReplicaSets may shrink without going
    /// below spec.replicas - maxUnavailable, counting the new ReplicaSet's unavailable Pods as
    /// already missing; unhealthy old replicas go first.
    fn reconcile_old_replica_sets(&mut self, all: &[usize], old: Vec<usize>, new: usize) -> bool {
        if replica_count(self.rs_list(&old)) == 0 {
            return false;
        }
        let all_pods = replica_count(self.rs_list(all));
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let new_rs = &self.rss[new];
        let new_unavailable = rs_replicas(new_rs) - rs_available(new_rs);
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return false;
        }
        // Upstream ends this step without an error when either half fails, and so do we for
        // the failures the plan can see (a scale-down that would grow a ReplicaSet).
        let Ok((old, cleaned)) = self.cleanup_unhealthy_replicas(old, max_scaled_down) else {
            return false;
        };
        let all: Vec<usize> = old.iter().copied().chain(iter::once(new)).collect();
        let Ok(scaled) = self.scale_down_old_replica_sets_for_rolling_update(&all, &old) else {
            return false;
        };
        cleaned + scaled > 0
    }

    /// `cleanupUnhealthyReplicas`: old ReplicaSets, oldest first, lose their unavailable replicas,
    /// at most `max_cleanup` in all.
    fn cleanup_unhealthy_replicas(
        &mut self,
        mut old: Vec<usize>,
        max_cleanup: i32,
    ) -> Result<(Vec<usize>, i32), ()> {
        old.sort_by(|&a, &b| by_creation(&self.rss[a], &self.rss[b]));
        let mut total = 0;
        for &i in &old {
            if total >= max_cleanup {
                break;
            }
            let have = rs_replicas(&self.rss[i]);
            let available = rs_available(&self.rss[i]);
            if have == 0 || have == available {
                continue;
            }
            let count = (max_cleanup - total).min(have - available);
            let n = have - count;
            if n > have {
                // More available than desired (a status not yet caught up): upstream refuses.
                return Err(());
            }
            self.scale_replica_set_and_record_event(i, n);
            total += count;
        }
        Ok((old, total))
    }

    /// `scaleDownOldReplicaSetsForRollingUpdate`: old ReplicaSets, oldest first, shrink by the
    /// available Pods above spec.replicas - maxUnavailable.
    fn scale_down_old_replica_sets_for_rolling_update(
        &mut self,
        all: &[usize],
        old: &[usize],
    ) -> Result<i32, ()> {
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let available = available_replica_count(self.rs_list(all));
        if available <= min_available {
            return Ok(0);
        }
        let mut old = old.to_vec();
        old.sort_by(|&a, &b| by_creation(&self.rss[a], &self.rss[b]));
        let target = available - min_available;
        let mut total = 0;
        for i in old {
            if total >= target {
                break;
            }
            let have = rs_replicas(&self.rss[i]);
            if have == 0 {
                continue;
            }
            let count = have.min(target - total);
            let n = have - count;
            if n > have {
                return Err(());
            }
            self.scale_replica_set_and_record_event(i, n);
            total += count;
        }
        Ok(total)
    }

    /// `rolloutRecreate` (DEP-8): old ReplicaSets to 0, wait until none of their Pods runs, then
    /// the new ReplicaSet (created only now) at spec.replicas.
    fn rollout_recreate(&mut self) -> Step<()> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(false)?;
        let mut all: Vec<usize> = old.iter().copied().chain(new).collect();
        let active_old = self.active(old.iter().copied());
        let mut scaled = false;
        for i in active_old {
            scaled |= self.scale_replica_set_and_record_event(i, 0);
        }
        if scaled || self.old_pods_running(new, &old) {
            self.sync_rollout_status(&all, new);
            return Ok(());
        }
        let (new, old) = match new {
            Some(n) => (n, old),
            None => {
                let (n, o) = self.get_all_replica_sets_and_sync_revision(true)?;
                let n = n.expect("a ReplicaSet is created when missing");
                all = o.iter().copied().chain(iter::once(n)).collect();
                (n, o)
            }
        };
        self.scale_replica_set_and_record_event(new, replicas(&self.d));
        if deployment_complete(&self.d, &self.status()) {
            self.cleanup_deployment(&old);
        }
        self.sync_rollout_status(&all, Some(new));
        Ok(())
    }

    /// `oldPodsRunning`: an old ReplicaSet still reports replicas, or a Pod of one is not
    /// Succeeded or Failed.
    fn old_pods_running(&self, new: Option<usize>, old: &[usize]) -> bool {
        if actual_replica_count(self.rs_list(old)) > 0 {
            return true;
        }
        let new_uid = new.and_then(|i| self.rss[i].metadata.uid.clone());
        self.input
            .pods
            .iter()
            .filter(|(uid, _)| new_uid.as_deref() != Some(uid.as_str()))
            .flat_map(|(_, pods)| pods)
            .any(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
    }

    // --- legacy rollback ----------------------------------------------------------------------

    /// `rollback`: the template of the requested revision (0: the previous one) is copied into
    /// the Deployment, with its annotations; the request annotation is removed in any case.
    fn rollback(&mut self) -> Step<()> {
        let (new, old) = self.get_all_replica_sets_and_sync_revision(true)?;
        let all: Vec<usize> = old.iter().copied().chain(new).collect();
        let mut target = rollback_to(&self.d).unwrap_or(0);
        if target == 0 {
            target = last_revision(self.rs_list(&all));
            if target == 0 {
                self.event(
                    true,
                    REASON_ROLLBACK_NOT_FOUND,
                    "Unable to find last revision.".into(),
                );
                self.clear_rollback_to();
                return Ok(());
            }
        }
        for &i in &all {
            if revision(&self.rss[i].metadata.annotations) != Ok(target) {
                continue;
            }
            let template = rs_template(&self.rss[i]);
            let current = self.d.spec.clone().unwrap_or_default().template;
            let performed = !equal_ignore_hash(&current, &template);
            if performed {
                set_from_replica_set_template(&mut self.d, template);
                set_deployment_annotations_to(&mut self.d, &self.rss[i]);
            } else {
                let msg = format!(
                    "The rollback revision contains the same template as current deployment {:?}",
                    self.name()
                );
                self.event(true, REASON_ROLLBACK_UNCHANGED, msg);
            }
            self.clear_rollback_to();
            if performed {
                let msg = format!(
                    "Rolled back deployment {:?} to revision {target}",
                    self.name()
                );
                self.event(false, REASON_ROLLBACK_DONE, msg);
            }
            return Ok(());
        }
        self.event(
            true,
            REASON_ROLLBACK_NOT_FOUND,
            "Unable to find the revision to rollback to.".into(),
        );
        self.clear_rollback_to();
        Ok(())
    }

    /// `updateDeploymentAndClearRollbackTo`.
    fn clear_rollback_to(&mut self) {
        if let Some(a) = self.d.metadata.annotations.as_mut() {
            a.remove(DEPRECATED_ROLLBACK_TO);
        }
        self.out
            .actions
            .push(Action::UpdateDeployment(Box::new(self.d.clone())));
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
