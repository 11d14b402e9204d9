//! The ReplicationController controller (kube-controller-manager v1.34's `replicationcontroller`,
//! upstream's `pkg/controller/replication`): the ReplicaSet controller's [`Base`] run over
//! ReplicationControllers, each read as the ReplicaSet it converts to, as upstream treats a
//! ReplicationController as an older API version of ReplicaSet.
//!
//! Owns: the conversion of a ReplicationController to the ReplicaSet the plan reads
//! ([`to_replica_set`]) and the names upstream gives this instance: the work queue
//! `replicationmanager`, the Events' source `replication-controller`, and Pods' controller
//! references `v1 ReplicationController`. Everything else (handlers, expectations, adoption,
//! slow-start creations, the scale-down ranking, the ReplicaFailure condition with reasons
//! FailedCreate and FailedDelete, the status short-cut) is the ReplicaSet controller's, so the
//! two cannot drift apart.
//!
//! The status is written through the ReplicationController's status subresource with the
//! fields its API has (no terminatingReplicas, which upstream turns off for this instance too).
//! `kubectl scale rc` changes `spec.replicas` through the scale subresource; the next sync
//! creates or deletes Pods. A rolling replacement by hand (two ReplicationControllers with
//! different selectors, one scaled up while the other is scaled down) is two independent
//! ReplicationControllers here, as upstream.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{
    ReplicaSet, ReplicaSetCondition, ReplicaSetSpec, ReplicaSetStatus,
};
use k8s_openapi::api::core::v1::ReplicationController;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;

use super::{plan, Base, Config, Flavor};
use crate::runtime::informer::Informers;

/// The work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "replicationmanager";

/// The Events' source component, as upstream names it.
pub const COMPONENT: &str = "replication-controller";

/// ReplicationControllers, `v1`.
pub const REPLICATION_CONTROLLER: plan::Kind = plan::Kind {
    api_version: "v1",
    kind: "ReplicationController",
};

/// A ReplicationController's status fields (a ReplicaSet's without terminatingReplicas).
pub const STATUS_FIELDS: &[&str] = &[
    "availableReplicas",
    "conditions",
    "fullyLabeledReplicas",
    "observedGeneration",
    "readyReplicas",
    "replicas",
];

/// ReplicationControllers, read as ReplicaSets.
pub struct ReplicationControllers;

impl Flavor for ReplicationControllers {
    type Object = ReplicationController;
    const KIND: plan::Kind = REPLICATION_CONTROLLER;
    const NAME: &'static str = "replicationcontroller";
    const QUEUE_NAME: &'static str = QUEUE_NAME;
    const COMPONENT: &'static str = COMPONENT;
    const STATUS_FIELDS: &'static [&'static str] = STATUS_FIELDS;

    fn view(obj: Arc<ReplicationController>) -> Arc<ReplicaSet> {
        Arc::new(to_replica_set(&obj))
    }
}

/// The ReplicationController controller.
pub type Controller = Base<ReplicationControllers>;

/// Creates the ReplicationController controller on `informers` (`config.workers` is
/// `--concurrent-rc-syncs`, default 5).
pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
    Controller::new(client, informers, config)
}

/// The ReplicaSet a ReplicationController converts to (upstream's `convertRCtoRS`): the same
/// metadata; replicas, minReadySeconds and template as they are; the selector map as
/// `matchLabels` (the API server requires a non-empty one, defaulted from the template's
/// labels); the status with its conditions, field for field.
pub fn to_replica_set(rc: &ReplicationController) -> ReplicaSet {
    let spec = rc.spec.clone().unwrap_or_default();
    let status = rc.status.as_ref().map(|s| ReplicaSetStatus {
        available_replicas: s.available_replicas,
        conditions: s.conditions.as_ref().map(|cs| {
            cs.iter()
                .map(|c| ReplicaSetCondition {
                    last_transition_time: c.last_transition_time.clone(),
                    message: c.message.clone(),
                    reason: c.reason.clone(),
                    status: c.status.clone(),
                    type_: c.type_.clone(),
                })
                .collect()
        }),
        fully_labeled_replicas: s.fully_labeled_replicas,
        observed_generation: s.observed_generation,
        ready_replicas: s.ready_replicas,
        replicas: s.replicas,
        terminating_replicas: None,
    });
    ReplicaSet {
        metadata: rc.metadata.clone(),
        spec: Some(ReplicaSetSpec {
            min_ready_seconds: spec.min_ready_seconds,
            replicas: spec.replicas,
            selector: LabelSelector {
                match_expressions: None,
                match_labels: spec.selector,
            },
            template: spec.template,
        }),
        status,
    }
}

#[cfg(test)]
#[path = "replication_tests.rs"]
mod tests;
