//! The PV protection controller (kube-controller-manager v1.34's `persistentvolume-protection`,
//! `pkg/controller/volume/pvprotection`): every PersistentVolume not being deleted gets the
//! `kubernetes.io/pv-protection` finalizer; a volume being deleted loses it once it is not
//! Bound, so a bound volume outlives its deletion request until its claim lets go.
//!
//! Owns that finalizer only. One queue (`pvprotection`), one worker, as upstream; the decision
//! is [`plan`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "persistentvolume-protection";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "pvprotection";

/// The finalizer.
pub const FINALIZER: &str = "kubernetes.io/pv-protection";

/// What to do with a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    AddFinalizer,
    RemoveFinalizer,
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// `processPV`: a deletion candidate (being deleted, with the finalizer) not Bound loses it; a
/// volume not being deleted without it gets it.
pub fn plan(pv: &PersistentVolume) -> Step {
    let deleting = pv.metadata.deletion_timestamp.is_some();
    let bound = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Bound");
    match (deleting, has_finalizer(pv)) {
        (true, true) if !bound => Step::RemoveFinalizer,
        (false, false) => Step::AddFinalizer,
        _ => Step::Nothing,
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    volumes: Arc<Indexed<PersistentVolume>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the shared PersistentVolume informer.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let informer = informers.get::<PersistentVolume>();
        let this = Arc::new(Controller {
            client,
            volumes: informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        informer.on_change_of(&this, |c, _, new| {
            if let Some(pv) = new {
                if plan(pv) != Step::Nothing {
                    c.queue.add(pv.metadata.name.clone().unwrap_or_default());
                }
            }
        });
        this
    }

    /// Waits for the cache, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.volumes], &self.queue, 1).await;
    }
}

impl SyncKey for Controller {
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(pv) = self.volumes.get("", name) else {
            return Ok(());
        };
        let mut new = (*pv).clone();
        let finalizers = new.metadata.finalizers.get_or_insert_with(Vec::new);
        match plan(&pv) {
            Step::Nothing => return Ok(()),
            Step::AddFinalizer => finalizers.push(FINALIZER.to_string()),
            Step::RemoveFinalizer => finalizers.retain(|f| f != FINALIZER),
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.replace(name, &PostParams::default(), &new).await {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "updating the finalizers of",
                format!("PersistentVolume {name}"),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_finalizer_comes_on_and_goes_once_not_bound() {
        let fresh = pv(serde_json::json!({"metadata": {"name": "v"}}));
        assert_eq!(plan(&fresh), Step::AddFinalizer);
        let deleting = |phase: &str| {
            pv(
                serde_json::json!({"metadata": {"name": "v", "finalizers": [FINALIZER],
                "deletionTimestamp": "2024-01-01T00:00:00Z"}, "status": {"phase": phase}}),
            )
        };
        assert_eq!(plan(&deleting("Bound")), Step::Nothing);
        assert_eq!(plan(&deleting("Released")), Step::RemoveFinalizer);
        assert_eq!(plan(&deleting("Available")), Step::RemoveFinalizer);
    }
}
