//! Preemption's API side, as upstream's asynchronous preemption (`Evaluator.prepareCandidateAsync`
//! in pkg/scheduler/framework/preemption; SchedulerAsyncPreemption, on by default since v1.33):
//! once DefaultPreemption has chosen a node and its victims (a pure simulation,
//! [`plugins::default_preemption`](super::plugins::default_preemption)), a task clears the
//! nominations of lower-priority Pods nominated to that node, then gives each victim the
//! DisruptionTarget condition and deletes it with a Preempted Event, all victims but the last in
//! parallel, the last one alone.
//!
//! While the task runs, the queue holds the preemptor gated ([`QueueCore::begin_preemption`]):
//! retried before its victims are gone, it would find them still in place and preempt again. The
//! gate lifts when the watch shows the last victim deleted or terminating (upstream v1.35's
//! lastVictimsPendingPreemption), and that event moves the preemptor back. Victims already
//! terminating get no second call, as upstream.
//!
//! Owns only these writes; the preemptor's own nomination is written by the failure handling in
//! [`schedule_one`](super::schedule_one).
//!
//! [`QueueCore::begin_preemption`]: super::queue::QueueCore::begin_preemption

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource as _};
use serde_json::json;

use super::framework::runtime::{Framework, Nominations};
use super::scheduler::{full_name, uid, Scheduler};
use crate::runtime::events::Recorder;

/// The condition upstream's PreemptPod gives a victim before deleting it.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason (v1.PodReasonPreemptionByScheduler).
pub const REASON_PREEMPTION_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// Whether the victim already carries a true DisruptionTarget condition with preemption's
/// reason (upstream's UpdatePodCondition then changes nothing and no patch is sent).
fn has_disruption_target(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == DISRUPTION_TARGET))
        .is_some_and(|c| {
            c.status == "True" && c.reason.as_deref() == Some(REASON_PREEMPTION_BY_SCHEDULER)
        })
}

/// The victims that need API calls: those not terminating already (upstream: "Graceful pod
/// deletion has already started. Sending another API call is unnecessary.").
pub fn victims_to_delete(victims: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
    victims
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .cloned()
        .collect()
}

/// What one victim's preemption did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Deleted,
    /// Already gone (404 on the patch or the delete).
    Gone,
    Failed,
}

/// Upstream's PreemptPod for a victim: the DisruptionTarget condition (unless it has it), then
/// the deletion, then the Preempted Event.
async fn preempt_victim(
    client: Client,
    recorder: &Recorder,
    victim: &Pod,
    scheduler: &str,
    preemptor_uid: &str,
    node: &str,
) -> Outcome {
    let ns = victim.metadata.namespace.as_deref().unwrap_or_default();
    let name = victim.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, ns);
    if !has_disruption_target(victim) {
        let patch = json!({"status": {"conditions": [{
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION_BY_SCHEDULER,
            "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}});
        let r = api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await;
        match r {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Outcome::Gone,
            Err(e) => {
                tracing::warn!(pod = full_name(victim), "DisruptionTarget condition: {e}");
                return Outcome::Failed;
            }
        }
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            recorder.publish(
                &victim.object_ref(&()),
                false,
                "Preempted",
                format!("Preempted by pod {preemptor_uid} on node {node}"),
            );
            Outcome::Deleted
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Gone,
        Err(e) => {
            tracing::warn!(pod = full_name(victim), "deleting victim: {e}");
            Outcome::Failed
        }
    }
}

impl Scheduler {
    /// Preemption's API side: lower-priority Pods nominated to the node lose their nomination,
    /// the victims get the DisruptionTarget condition, an Event, and are deleted; the preemptor
    /// stays gated in the queue meanwhile.
    pub(super) fn preempt(
        &self,
        fw: &Arc<Framework>,
        pod: &Arc<Pod>,
        node: &str,
        victims: &[Arc<Pod>],
        nominated: &Nominations,
    ) {
        let prio = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let lower: Vec<Arc<Pod>> = nominated
            .get(node)
            .into_iter()
            .flatten()
            .filter(|p| {
                p.uid() != uid(pod)
                    && p.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0) < prio
            })
            .map(|p| p.pod.clone())
            .collect();
        let victims = victims_to_delete(victims);
        let preemptor_uid = uid(pod).to_string();
        self.queue.with(|q, _| {
            for p in &lower {
                q.delete_nominated(uid(p));
            }
            if !victims.is_empty() {
                q.begin_preemption(&preemptor_uid);
            }
        });
        if victims.is_empty() && lower.is_empty() {
            return;
        }
        let client = self.client.clone();
        let recorder = self.recorders[&fw.name].clone();
        let node = node.to_string();
        let scheduler = fw.name.clone();
        let queue = self.queue.clone();
        let preemptor = full_name(pod);
        tokio::spawn(async move {
            join_all(lower.iter().map(|p| {
                let api: Api<Pod> = Api::namespaced(
                    client.clone(),
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                );
                async move {
                    let name = p.metadata.name.as_deref().unwrap_or_default();
                    let patch = Patch::Strategic(json!({"status": {"nominatedNodeName": null}}));
                    let r = api
                        .patch_status(name, &PatchParams::default(), &patch)
                        .await;
                    if let Err(e) = r {
                        tracing::warn!(pod = full_name(p), "clearing nominatedNodeName: {e}");
                    }
                }
            }))
            .await;
            let Some((last, rest)) = victims.split_last() else {
                return;
            };
            let preempt = |v: &Arc<Pod>| {
                let (client, recorder) = (client.clone(), recorder.clone());
                let (scheduler, preemptor_uid, node) = (&scheduler, &preemptor_uid, &node);
                let v = v.clone();
                async move {
                    preempt_victim(client, &recorder, &v, scheduler, preemptor_uid, node).await
                }
            };
            let outcomes = join_all(rest.iter().map(&preempt)).await;
            // After a failure the last victim is spared, as upstream.
            let outcome = if outcomes.contains(&Outcome::Failed) {
                Outcome::Failed
            } else {
                queue.with(|q, _| q.await_last_victim(&preemptor_uid, uid(last)));
                preempt(last).await
            };
            match outcome {
                // Its deletion event (or deletionTimestamp) ends the preemption and moves the
                // preemptor.
                Outcome::Deleted => {}
                // Gone before the call: that event may have passed already.
                Outcome::Gone => queue.with(|q, now| {
                    q.end_preemption(&preemptor_uid);
                    q.activate(&preemptor_uid, now);
                }),
                // Retried at once rather than wait for an event that may never come.
                Outcome::Failed => {
                    tracing::warn!(pod = preemptor, node, "preemption failed; retrying the Pod");
                    queue.with(|q, now| {
                        q.end_preemption(&preemptor_uid);
                        q.activate(&preemptor_uid, now);
                    });
                }
            }
        });
    }
}
