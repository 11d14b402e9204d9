//! The ServiceAccount controller (kube-controller-manager v1.34's `serviceaccount-controller`,
//! `pkg/controller/serviceaccount/serviceaccounts_controller.go`): the `default` ServiceAccount in
//! every active namespace, created when a namespace appears and again whenever it is deleted.
//! The API server's ServiceAccount admission refuses Pods whose account does not exist, so
//! without it no Pod of a new namespace starts.
//!
//! Owns: creating the ServiceAccounts it ensures (only `default`, as upstream's defaults). Never
//! updates or deletes one. A namespace is synced when it is added or updated (a re-listing
//! included) and when a ServiceAccount in it is deleted; a namespace not Active (being deleted)
//! gets nothing, and a create refused because the namespace is terminating is not retried.
//! One worker, as kube-controller-manager runs it (there is no flag for more).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::PostParams;
use kube::core::ObjectMeta;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::meta;
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs.
pub const NAME: &str = "serviceaccount";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "serviceaccount";

/// The ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";

/// The controller's settings.
#[derive(Clone)]
pub struct Config {
    /// The ServiceAccounts to ensure in every namespace (upstream's
    /// `DefaultServiceAccountsControllerOptions`: `default`).
    pub accounts: Vec<String>,
    /// Workers (kube-controller-manager runs one).
    pub workers: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            accounts: vec![DEFAULT.to_string()],
            workers: 1,
        }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    namespaces: Arc<Indexed<Namespace>>,
    accounts: Arc<Indexed<ServiceAccount>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the shared Namespace and ServiceAccount informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let ns_informer = informers.get::<Namespace>();
        let sa_informer = informers.get::<ServiceAccount>();
        let this = Arc::new(Controller {
            client,
            config,
            namespaces: ns_informer.cache(),
            accounts: sa_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        // A namespace added or updated (its re-listing too): look at it.
        ns_informer.on_change_of(&this, |c, _, new| {
            if let Some(name) = new.and_then(|ns| ns.metadata.name.clone()) {
                c.queue.add(name);
            }
        });
        // A ServiceAccount deleted: its namespace may need it back.
        sa_informer.on_change_of(&this, |c, old, new| {
            if let (Some(sa), None) = (old, new) {
                c.queue
                    .add(sa.metadata.namespace.clone().unwrap_or_default());
            }
        });
        this
    }

    /// Waits for the caches, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.accounts, &*self.namespaces],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// The accounts namespace `ns` lacks (none when it is gone or not Active).
    pub fn missing(&self, ns: &str) -> Vec<&str> {
        match self.namespaces.get("", ns) {
            Some(n) if meta::namespace_is_active(&n) => self
                .config
                .accounts
                .iter()
                .filter(|a| self.accounts.get(ns, a).is_none())
                .map(String::as_str)
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl SyncKey for Controller {
    /// `syncNamespace`: creates the accounts the namespace lacks.
    async fn sync(&self, ns: &str) -> Result<()> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let mut failures = Vec::new();
        for name in self.missing(ns) {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(ns.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &sa).await {
                Ok(_) => tracing::debug!(namespace = ns, name, "created ServiceAccount"),
                Err(e) if apierrors::is_already_exists(&e) => {}
                // A namespace being deleted takes no new objects: nothing to retry.
                Err(e) if apierrors::namespace_terminating(&e) => {}
                Err(e) => failures.push(format!("ServiceAccount {ns}/{name}: {e}")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                object: format!("namespace {ns}"),
                reason: format!("creating: {}", failures.join("; ")),
            })
        }
    }
}
