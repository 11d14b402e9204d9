//! The ValidatingAdmissionPolicy status controller (kube-controller-manager v1.34's
//! `validatingadmissionpolicy-status-controller`, `pkg/controller/validatingadmissionpolicystatus`):
//! `status.observedGeneration` and `status.typeChecking` of every ValidatingAdmissionPolicy.
//!
//! Owns: those two status fields, written by server-side apply with the field manager
//! `validatingadmissionpolicy-status` (forced), as upstream, once per generation: a policy whose
//! `metadata.generation` is above its `status.observedGeneration` gets both.
//!
//! Not done: upstream type-checks each `spec.validations[*].expression` and `messageExpression`
//! with CEL against the OpenAPI schema of every kind the policy's `matchConstraints` name (and of
//! its `paramKind`) and writes one `expressionWarnings` entry per expression that does not
//! type-check. kpr has no CEL type checker: it writes `typeChecking: {}` (no warnings) for every
//! policy, which is what upstream writes for a policy whose expressions type-check, for one whose
//! rules name no resolvable kind (`*`, an unknown resource) and for one whose types have no schema.
//! Expressions that do not parse never reach the controller: kube-apiserver compiles them at
//! admission of the policy and rejects it. docs/WORKLOADS.md lists the difference.
//!
//! Queueing, as upstream: adds and updates queue the policy's name; deletes nothing. The work
//! queue `validatingadmissionpolicy-status` with the default controller rate limiter,
//! `--concurrent-validating-admission-policy-status-syncs` workers (default 5).

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{EventHandlers, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey, WorkersConfig};

/// The controller's name in logs.
pub const NAME: &str = "validatingadmissionpolicy-status-controller";

/// The field manager and work queue name (upstream's `ControllerName`).
pub const FIELD_MANAGER: &str = "validatingadmissionpolicy-status";

/// `--concurrent-validating-admission-policy-status-syncs` (default 5).
pub type Config = WorkersConfig<5>;

/// The status to apply to `policy`, or `None` when it has observed its generation already
/// (upstream's `reconcile`).
pub fn plan(policy: &ValidatingAdmissionPolicy) -> Option<serde_json::Value> {
    let generation = policy.metadata.generation.unwrap_or(0);
    let observed = policy
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    if generation <= observed {
        return None;
    }
    // No warnings: kpr does not type-check (module doc). Upstream's apply configuration with no
    // warnings serializes `typeChecking: {}`.
    Some(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy.name_any()},
        "status": {"observedGeneration": generation, "typeChecking": {}},
    }))
}

/// The running controller.
pub struct Controller {
    client: Client,
    policies: Arc<Indexed<ValidatingAdmissionPolicy>>,
    queue: Arc<WorkQueue<String>>,
    workers: usize,
}

impl Controller {
    /// Registers the controller's handlers on the ValidatingAdmissionPolicy informer.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let informer = informers.get::<ValidatingAdmissionPolicy>();
        let this = Arc::new(Controller {
            client,
            policies: informer.cache(),
            queue: WorkQueue::new(FIELD_MANAGER),
            workers: config.workers,
        });
        informer.on_events_of(
            &this,
            EventHandlers {
                added: |c, p| c.queue.add(p.name_any()),
                updated: |c, _, p| c.queue.add(p.name_any()),
                deleted: |_, _| {},
            },
        );
        this
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        let workers = self.workers;
        run_controller(&self, NAME, &[&*self.policies], &self.queue, workers).await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(policy) = self.policies.get("", name) else {
            return Ok(());
        };
        let Some(body) = plan(&policy) else {
            return Ok(());
        };
        let api: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        match api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "writing the status of",
                format!("ValidatingAdmissionPolicy {name}"),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(generation: i64, observed: Option<i64>) -> ValidatingAdmissionPolicy {
        let mut v = json!({"metadata": {"name": "p", "generation": generation},
            "spec": {"validations": [{"expression": "object.spec.replicas < 5"}]}});
        if let Some(o) = observed {
            v["status"] = json!({"observedGeneration": o});
        }
        serde_json::from_value(v).unwrap()
    }

    /// Upstream's `TestTypeCheck` shape for policies that type-check: the generation observed,
    /// no warnings; nothing written once observed.
    #[test]
    fn each_generation_is_observed_once_with_no_warnings() {
        let body = plan(&policy(1, None)).expect("a new policy gets a status");
        assert_eq!(
            body["status"],
            json!({"observedGeneration": 1, "typeChecking": {}})
        );
        assert_eq!(body["metadata"]["name"], "p");
        assert_eq!(plan(&policy(1, Some(1))), None);
        assert_eq!(
            plan(&policy(3, Some(2))).unwrap()["status"]["observedGeneration"],
            3
        );
        assert_eq!(plan(&policy(2, Some(5))), None, "never moves back");
    }
}
