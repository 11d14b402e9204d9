//! Preemption's API side (upstream's `Evaluator.prepareCandidate` in
//! pkg/scheduler/framework/preemption): once DefaultPreemption has chosen a node and its victims
//! (a pure simulation, [`plugins::default_preemption`](super::plugins::default_preemption)),
//! the victims get the DisruptionTarget condition, are deleted with a Preempted Event, and
//! lower-priority Pods nominated to that node lose their nomination.
//!
//! Owns only these writes; the preemptor's own nomination is written by the failure handling in
//! [`schedule_one`](super::schedule_one).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource as _};
use serde_json::json;

use super::framework::runtime::{Framework, Nominations};
use super::scheduler::{full_name, uid, Scheduler};

impl Scheduler {
    /// Preemption's API side: victims get the DisruptionTarget condition, an Event, and are
    /// deleted; lower-priority Pods nominated to the node lose their nomination.
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
        self.queue.with(|q, _| {
            for p in &lower {
                q.delete_nominated(uid(p));
            }
        });
        let client = self.client.clone();
        let recorder = self.recorders[&fw.name].clone();
        let victims = victims.to_vec();
        let preemptor_uid = uid(pod).to_string();
        let node = node.to_string();
        let scheduler = fw.name.clone();
        tokio::spawn(async move {
            for p in lower {
                let api: Api<Pod> = Api::namespaced(
                    client.clone(),
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                );
                let patch = json!({"status": {"nominatedNodeName": null}});
                if let Err(e) = api
                    .patch_status(
                        p.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Strategic(patch),
                    )
                    .await
                {
                    tracing::warn!(pod = full_name(&p), "clearing nominatedNodeName: {e}");
                }
            }
            for v in victims {
                let ns = v.metadata.namespace.as_deref().unwrap_or_default();
                let name = v.metadata.name.as_deref().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), ns);
                let patch = json!({"status": {"conditions": [{
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
                    "lastTransitionTime": Timestamp::now().to_string(),
                }]}});
                if let Err(e) = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                {
                    tracing::debug!(pod = full_name(&v), "DisruptionTarget condition: {e}");
                }
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => recorder.publish(
                        &v.object_ref(&()),
                        false,
                        "Preempted",
                        format!("Preempted by pod {preemptor_uid} on node {node}"),
                    ),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => tracing::warn!(pod = full_name(&v), "deleting victim: {e}"),
                }
            }
        });
    }
}
