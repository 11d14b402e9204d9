//! The token cleaner (kube-controller-manager v1.34's `token-cleaner-controller`, alias
//! `tokencleaner`, `pkg/controller/bootstrap/tokencleaner.go`; off by default, as upstream:
//! kubeadm turns it on): deletes a bootstrap token Secret of `kube-system` once its
//! `expiration` has passed (an unreadable `expiration` counts as passed, as upstream), and looks
//! at one not yet expired again when it expires.
//!
//! Owns: the deletion of expired bootstrap token Secrets, with the Secret's UID as a
//! precondition (a Secret recreated under the name is not deleted for its predecessor). A
//! Secret is synced when added or updated (a re-listing included), through the work queue
//! `token_cleaner`; a failed delete is logged and not retried, as upstream.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client};

use crate::error::Result;
use crate::helpers::bootstraptoken;
use crate::helpers::clock::{Clock, SystemClock};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{key_of, split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs.
pub const NAME: &str = "tokencleaner";
/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "token_cleaner";

/// What to do with a bootstrap token Secret.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Expired: delete it.
    Delete,
    /// Look again after this long (when it expires).
    Requeue(Duration),
    /// No `expiration`: never expires.
    Keep,
}

/// `evalSecret`'s decision for `s` at `now`.
pub fn plan(s: &Secret, now: jiff::Timestamp) -> Plan {
    match bootstraptoken::time_left(s, now) {
        bootstraptoken::Expiry::Expired => Plan::Delete,
        bootstraptoken::Expiry::In(left) => Plan::Requeue(left.unsigned_abs()),
        bootstraptoken::Expiry::Never => Plan::Keep,
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    secrets: Arc<Indexed<Secret>>,
    queue: Arc<WorkQueue<String>>,
    clock: Arc<dyn Clock>,
}

impl Controller {
    /// Registers the controller's handler on the shared Secret informer.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let secrets = informers.get::<Secret>();
        let this = Arc::new(Controller {
            client,
            secrets: secrets.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            clock: Arc::new(SystemClock),
        });
        // Added or updated (upstream has no delete handler).
        secrets.on_change_of(&this, |c, _, new| {
            if let Some(s) = new.filter(|s| bootstraptoken::is_token_secret(s)) {
                c.queue.add(key_of(&**s));
            }
        });
        this
    }

    /// Waits for the Secret cache, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.secrets], &self.queue, 1).await;
    }

    /// Stops the worker.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    /// `syncFunc` and `evalSecret`.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(s) = self.secrets.get(ns, name) else {
            return Ok(());
        };
        if s.type_.as_deref() != Some(bootstraptoken::SECRET_TYPE) {
            return Ok(());
        }
        match plan(&s, self.clock.now()) {
            Plan::Delete => {
                tracing::info!(controller = NAME, secret = key, "deleting expired secret");
                let dp = DeleteParams {
                    preconditions: s.metadata.uid.clone().map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
                match api.delete(name, &dp).await {
                    Ok(_) => {}
                    // Gone already, or another Secret under the name.
                    Err(e) if apierrors::is_not_found(&e) || apierrors::is_conflict(&e) => {}
                    Err(e) => tracing::warn!(controller = NAME, secret = key, "deleting: {e}"),
                }
            }
            Plan::Requeue(after) => self.queue.add_after(key.to_string(), after),
            Plan::Keep => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn token(expiration: Option<&str>) -> Secret {
        let mut data = json!({"token-id": "YWJjMTIz", "token-secret": "c2VjcmV0"});
        if let Some(e) = expiration {
            use base64::Engine as _;
            data["expiration"] = json!(base64::engine::general_purpose::STANDARD.encode(e));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "bootstrap-token-abc123", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "data": data}))
        .unwrap()
    }

    /// Upstream's `TestCleanerNoExpiration`, `TestCleanerExpired`, `TestCleanerNotExpired`,
    /// `TestCleanerExpiredAt` and an unreadable expiration.
    #[test]
    fn upstream_cleaner_cases() {
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(plan(&token(None), now), Plan::Keep);
        assert_eq!(
            plan(&token(Some("2025-12-31T23:00:00Z")), now),
            Plan::Delete
        );
        assert_eq!(
            plan(&token(Some("2026-01-01T01:00:00Z")), now),
            Plan::Requeue(Duration::from_secs(3600))
        );
        assert_eq!(
            plan(&token(Some("2026-01-01T00:00:00Z")), now),
            Plan::Delete
        );
        assert_eq!(plan(&token(Some("soon")), now), Plan::Delete);
    }
}
