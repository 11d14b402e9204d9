//! The test as the kubelet of gated Pods. The control plane's kwok runs with
//! `--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom`: a Pod carrying
//! [`GATE`] is left alone by kwok, so the test decides when it becomes Ready or finishes, which
//! makes the scenarios step deterministically. kwok would also delete a terminating Pod by name,
//! possibly twice, and the second call can hit the Pod a controller created in its place a moment
//! before; the [`Kubelet`] removes a terminating gated Pod once, by uid.
//!
//! Owns: the writes to gated Pods' status and their final deletion.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt as _};

/// The Pod annotation (name, value) that makes kwok leave a Pod alone.
pub const GATE: (&str, &str) = ("kwok.x-k8s.io/status", "custom");

pub fn is_gated(pod: &Pod) -> bool {
    pod.annotations().get(GATE.0).map(String::as_str) == Some(GATE.1)
}

/// The Ready condition's transition time if the Pod is Ready.
pub fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let cond = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if cond.status != "True" {
        return None;
    }
    Some(
        cond.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH),
    )
}

/// The Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// The kubelet's part for the gated Pods of one namespace, each step once per Pod uid.
#[derive(Clone)]
pub struct Kubelet {
    pods: Api<Pod>,
    started: Arc<Mutex<BTreeSet<String>>>,
    stopped: Arc<Mutex<BTreeSet<String>>>,
}

impl Kubelet {
    pub fn new(pods: Api<Pod>) -> Kubelet {
        Kubelet {
            pods,
            started: Default::default(),
            stopped: Default::default(),
        }
    }

    /// A terminating gated Pod whose containers have stopped: deleted with grace period 0 and
    /// its uid as precondition, in the background. Other Pods are left alone.
    pub fn finish_terminating(&self, p: &Pod) {
        if !is_gated(p) || p.metadata.deletion_timestamp.is_none() {
            return;
        }
        let uid = p.uid().unwrap_or_default();
        if !self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.clone())
        {
            return;
        }
        let (pods, name) = (self.pods.clone(), p.name_any());
        tokio::spawn(async move {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let _ = pods.delete(&name, &dp).await;
        });
    }

    /// A new gated Pod is made Running and Ready at once (in the background); a terminating one
    /// is finished ([`Kubelet::finish_terminating`]).
    pub fn run(&self, p: &Pod) {
        if !is_gated(p) {
            return;
        }
        if p.metadata.deletion_timestamp.is_some() {
            return self.finish_terminating(p);
        }
        let uid = p.uid().unwrap_or_default();
        if is_ready(p)
            || !self
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone())
        {
            return;
        }
        let (pods, name) = (self.pods.clone(), p.name_any());
        tokio::spawn(async move {
            let now = Timestamp::now().to_string();
            let status = serde_json::json!({
                "metadata": {"uid": uid},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}
            });
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        });
    }
}
