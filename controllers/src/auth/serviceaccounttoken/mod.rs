//! The service-account token controller (kube-controller-manager v1.34's
//! `serviceaccount-token-controller`, alias `serviceaccount-token`,
//! `pkg/controller/serviceaccount/tokens_controller.go`): fills every Secret of type
//! `kubernetes.io/service-account-token` whose ServiceAccount exists with `token` (a legacy
//! token signed with `--service-account-private-key-file`, [`jwt`]), `ca.crt` (the bundle of
//! `--root-ca-file`) and `namespace`, and sets its `kubernetes.io/service-account.name` and
//! `.uid` annotations; deletes such a Secret once its ServiceAccount is gone (the account of its
//! annotations, the UID when it has one); and takes a deleted token Secret out of its
//! ServiceAccount's `secrets` list. Since v1.24 it creates no token Secret itself.
//!
//! Owns: the data and those annotations of token Secrets (written only when `token` or
//! `namespace` is empty or `ca.crt` is not the bundle; a Secret changed since the cache saw it
//! is left for its next event, as upstream), their deletion, and the `secrets` lists of
//! ServiceAccounts. Two work queues: ServiceAccounts (`serviceaccount_tokens_service`: a deleted
//! account's tokens are deleted) and token Secrets (`serviceaccount_tokens_secret`), each key
//! retried at most 10 times, each with `--concurrent-serviceaccount-token-syncs` workers (5).
//!
//! Difference from upstream: upstream names both queues `serviceaccount_tokens_service` (so
//! their metrics add up under one name); the Secret queue here has its own name. Without
//! `--root-ca-file` no `ca.crt` is written (upstream takes the CA of its kubeconfig).

pub mod jwt;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{Informers, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::run_controller_with;

/// The controller's name in logs.
pub const NAME: &str = "serviceaccount-token";
/// The work queues' names.
pub const SA_QUEUE_NAME: &str = "serviceaccount_tokens_service";
pub const SECRET_QUEUE_NAME: &str = "serviceaccount_tokens_secret";
/// The Secret type and its keys and annotations (`v1.SecretTypeServiceAccountToken`, ...).
pub const SECRET_TYPE: &str = "kubernetes.io/service-account-token";
pub const TOKEN_KEY: &str = "token";
pub const CA_KEY: &str = "ca.crt";
pub const NAMESPACE_KEY: &str = "namespace";
pub const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
pub const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";
/// Retries of one key before it is dropped (upstream's `maxRetries`).
pub const MAX_RETRIES: u32 = 10;

/// The controller's settings.
#[derive(Clone)]
pub struct Config {
    /// Signs the tokens.
    pub signer: Arc<jwt::Signer>,
    /// The CA bundle written as `ca.crt` (empty: none).
    pub root_ca: Vec<u8>,
    /// Workers per queue (`--concurrent-serviceaccount-token-syncs`).
    pub workers: usize,
}

fn annotation<'a>(s: &'a Secret, key: &str) -> &'a str {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .unwrap_or_default()
}

fn bytes<'a>(s: &'a Secret, key: &str) -> &'a [u8] {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.as_slice())
        .unwrap_or_default()
}

/// `IsServiceAccountToken`: whether `s` is a token of the account `name` (of UID `uid`): its
/// type, its name annotation, and its UID annotation when it has one.
pub fn is_token_of(s: &Secret, name: &str, uid: &str) -> bool {
    let secret_uid = annotation(s, UID_ANNOTATION);
    s.type_.as_deref() == Some(SECRET_TYPE)
        && annotation(s, NAME_ANNOTATION) == name
        && (secret_uid.is_empty() || secret_uid == uid)
}

/// What a token Secret lacks (`secretUpdateNeeded`).
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
pub struct Needs {
    pub ca: bool,
    pub namespace: bool,
    pub token: bool,
}

impl Needs {
    pub fn any(self) -> bool {
        self.ca || self.namespace || self.token
    }
}

/// `secretUpdateNeeded`: `ca.crt` differs from a non-empty bundle, `namespace` or `token` empty.
pub fn needs(s: &Secret, root_ca: &[u8]) -> Needs {
    Needs {
        ca: !root_ca.is_empty() && bytes(s, CA_KEY) != root_ca,
        namespace: bytes(s, NAMESPACE_KEY).is_empty(),
        token: bytes(s, TOKEN_KEY).is_empty(),
    }
}

/// The Secret `generateTokenIfNeeded` writes: what `needs` says filled in (`token` given when
/// needed), and the account's name and UID annotations.
pub fn filled(
    live: &Secret,
    sa: &ServiceAccount,
    root_ca: &[u8],
    needs: Needs,
    token: Option<String>,
) -> Secret {
    let mut out = live.clone();
    let data = out.data.get_or_insert_with(BTreeMap::new);
    if needs.ca {
        data.insert(CA_KEY.into(), ByteString(root_ca.to_vec()));
    }
    if needs.namespace {
        let ns = live.metadata.namespace.clone().unwrap_or_default();
        data.insert(NAMESPACE_KEY.into(), ByteString(ns.into_bytes()));
    }
    if let Some(t) = token.filter(|_| needs.token) {
        data.insert(TOKEN_KEY.into(), ByteString(t.into_bytes()));
    }
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        NAME_ANNOTATION.into(),
        sa.metadata.name.clone().unwrap_or_default(),
    );
    annotations.insert(
        UID_ANNOTATION.into(),
        sa.metadata.uid.clone().unwrap_or_default(),
    );
    out
}

/// A ServiceAccount queue key: `ns/name/uid`.
fn sa_key(sa: &ServiceAccount) -> String {
    let m = &sa.metadata;
    format!(
        "{}/{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

/// A Secret queue key: `ns/name/uid/account name/account uid`.
fn secret_key(s: &Secret) -> String {
    let m = &s.metadata;
    format!(
        "{}/{}/{}/{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default(),
        annotation(s, NAME_ANNOTATION),
        annotation(s, UID_ANNOTATION)
    )
}

fn fields<const N: usize>(key: &str) -> [&str; N] {
    let mut out = [""; N];
    for (slot, part) in out.iter_mut().zip(key.splitn(N, '/')) {
        *slot = part;
    }
    out
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    accounts: Arc<Indexed<ServiceAccount>>,
    secrets: Arc<Indexed<Secret>>,
    sa_queue: Arc<WorkQueue<String>>,
    secret_queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the shared ServiceAccount and Secret informers.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let sa_informer = informers.get::<ServiceAccount>();
        let secret_informer = informers.get::<Secret>();
        let this = Arc::new(Controller {
            client,
            config,
            accounts: sa_informer.cache(),
            secrets: secret_informer.cache(),
            sa_queue: WorkQueue::new(SA_QUEUE_NAME),
            secret_queue: WorkQueue::new(SECRET_QUEUE_NAME),
        });
        sa_informer.on_change_of(&this, |c, old, new| {
            if let Some(sa) = new.or(old) {
                c.sa_queue.add(sa_key(sa));
            }
        });
        secret_informer.on_change_of(&this, |c, old, new| {
            if let Some(s) = new.or(old) {
                if s.type_.as_deref() == Some(SECRET_TYPE) {
                    c.secret_queue.add(secret_key(s));
                }
            }
        });
        this
    }

    /// Waits for the caches, then runs both queues' workers.
    pub async fn run(self: Arc<Self>) {
        let caches: [&dyn crate::runtime::workers::Synced; 2] = [&*self.accounts, &*self.secrets];
        let workers = self.config.workers;
        tokio::join!(
            run_controller_with(
                &self,
                NAME,
                &caches,
                &self.sa_queue,
                workers,
                |c, k| async move { c.limited(&c.sa_queue, &k, c.sync_service_account(&k).await) }
            ),
            run_controller_with(
                &self,
                NAME,
                &caches,
                &self.secret_queue,
                workers,
                |c, k| async move { c.limited(&c.secret_queue, &k, c.sync_secret(&k).await) }
            ),
        );
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.sa_queue.shut_down();
        self.secret_queue.shut_down();
    }

    /// `retryOrForget`: an error is retried until the key has been retried [`MAX_RETRIES`] times.
    fn limited(&self, queue: &WorkQueue<String>, key: &str, r: Result<()>) -> Result<()> {
        match r {
            Err(e) if queue.num_requeues(&key.to_string()) >= MAX_RETRIES => {
                tracing::error!(
                    controller = NAME,
                    key,
                    "giving up after {MAX_RETRIES} retries: {e}"
                );
                Ok(())
            }
            r => r,
        }
    }

    /// `getServiceAccount`: the account `ns/name` of UID `uid` (any when empty) from the cache,
    /// then (when `fetch`) from the API server.
    async fn service_account(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        fetch: bool,
    ) -> Result<Option<ServiceAccount>> {
        let matches =
            |sa: &ServiceAccount| uid.is_empty() || sa.metadata.uid.as_deref() == Some(uid);
        if let Some(sa) = self.accounts.get(ns, name).filter(|sa| matches(sa)) {
            return Ok(Some((*sa).clone()));
        }
        if !fetch {
            return Ok(None);
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let sa = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("getting ServiceAccount", format!("{ns}/{name}"), e))?;
        Ok(sa.filter(matches))
    }

    /// `syncServiceAccount`: the tokens of a deleted account are deleted.
    async fn sync_service_account(&self, key: &str) -> Result<()> {
        let [ns, name, uid] = fields::<3>(key);
        if self.service_account(ns, name, uid, false).await?.is_some() {
            return Ok(());
        }
        let mut failures = Vec::new();
        for s in self.secrets.index(NAMESPACE, ns) {
            if is_token_of(&s, name, uid) {
                let secret = s.metadata.name.as_deref().unwrap_or_default();
                if let Err(e) = self
                    .delete_token(ns, secret, s.metadata.uid.as_deref())
                    .await
                {
                    failures.push(format!("{ns}/{secret}: {e}"));
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                object: format!("ServiceAccount {ns}/{name}"),
                reason: format!("deleting its tokens: {}", failures.join("; ")),
            })
        }
    }

    /// `deleteToken`: with the UID as a precondition; gone or replaced is done.
    async fn delete_token(&self, ns: &str, name: &str, uid: Option<&str>) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            preconditions: uid.filter(|u| !u.is_empty()).map(|u| Preconditions {
                uid: Some(u.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {
                tracing::info!(controller = NAME, secret = %format!("{ns}/{name}"), "deleted token of a deleted ServiceAccount");
                Ok(())
            }
            Err(e) if apierrors::is_not_found(&e) || apierrors::is_conflict(&e) => Ok(()),
            Err(e) => Err(Error::kube(
                "deleting token Secret",
                format!("{ns}/{name}"),
                e,
            )),
        }
    }

    /// `syncSecret`.
    async fn sync_secret(&self, key: &str) -> Result<()> {
        let [ns, name, uid, sa_name, sa_uid] = fields::<5>(key);
        let cached = self
            .secrets
            .get(ns, name)
            .filter(|s| uid.is_empty() || s.metadata.uid.as_deref() == Some(uid));
        let Some(secret) = cached else {
            // Deleted: out of its account's list.
            if self
                .service_account(ns, sa_name, sa_uid, false)
                .await?
                .is_some()
            {
                if let Err(e) = self.remove_reference(ns, sa_name, sa_uid, name).await {
                    tracing::error!(controller = NAME, key, "removing secret reference: {e}");
                }
            }
            return Ok(());
        };
        match self.service_account(ns, sa_name, sa_uid, true).await? {
            None => self.delete_token(ns, name, Some(uid)).await,
            Some(sa) => self.generate_if_needed(&sa, &secret).await,
        }
    }

    /// `removeSecretReference`, retried on conflicts.
    async fn remove_reference(
        &self,
        ns: &str,
        sa_name: &str,
        sa_uid: &str,
        secret: &str,
    ) -> Result<()> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let mut attempt = 0;
        loop {
            let object = || format!("{ns}/{sa_name}");
            let got = api.get_opt(sa_name).await;
            let got = got.map_err(|e| Error::kube("getting ServiceAccount", object(), e))?;
            let Some(mut sa) = got else {
                return Ok(());
            };
            if !sa_uid.is_empty() && sa.metadata.uid.as_deref() != Some(sa_uid) {
                return Ok(());
            }
            let Some(list) = sa.secrets.as_mut() else {
                return Ok(());
            };
            let before = list.len();
            list.retain(|r| r.name.as_deref() != Some(secret));
            if list.len() == before {
                return Ok(());
            }
            match api.replace(sa_name, &PostParams::default(), &sa).await {
                Err(e) if apierrors::is_conflict(&e) && attempt < 4 => attempt += 1,
                r => {
                    return r
                        .map(|_| ())
                        .map_err(|e| Error::kube("updating ServiceAccount", object(), e))
                }
            }
        }
    }

    /// `generateTokenIfNeeded`.
    async fn generate_if_needed(&self, sa: &ServiceAccount, cached: &Secret) -> Result<()> {
        let root_ca = &self.config.root_ca;
        if !needs(cached, root_ca).any() {
            return Ok(());
        }
        let ns = cached.metadata.namespace.as_deref().unwrap_or_default();
        let name = cached.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let live = match api.get(name).await {
            Ok(s) => s,
            Err(e) if apierrors::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(Error::kube("getting Secret", format!("{ns}/{name}"), e)),
        };
        // Our view is stale: the Secret's next event brings us back.
        if live.metadata.resource_version != cached.metadata.resource_version {
            return Ok(());
        }
        let want = needs(&live, root_ca);
        if !want.any() {
            return Ok(());
        }
        let token = if want.token {
            let m = &sa.metadata;
            let t = self
                .config
                .signer
                .legacy_token(
                    m.namespace.as_deref().unwrap_or_default(),
                    m.name.as_deref().unwrap_or_default(),
                    m.uid.as_deref().unwrap_or_default(),
                    name,
                )
                .map_err(|reason| Error::Invalid {
                    object: format!("Secret {ns}/{name}"),
                    reason,
                })?;
            Some(t)
        } else {
            None
        };
        let out = filled(&live, sa, root_ca, want, token);
        match api.replace(name, &PostParams::default(), &out).await {
            Ok(_) => {
                tracing::info!(controller = NAME, secret = %format!("{ns}/{name}"), ?want, "populated token secret");
                Ok(())
            }
            Err(e) if apierrors::is_conflict(&e) || apierrors::is_not_found(&e) => {
                Err(Error::kube("updating Secret", format!("{ns}/{name}"), e))
            }
            Err(e) => {
                tracing::error!(controller = NAME, secret = %format!("{ns}/{name}"), "populating: {e}");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(annotations: serde_json::Value, data: serde_json::Value) -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns", "annotations": annotations},
            "type": SECRET_TYPE, "data": data}))
        .unwrap()
    }

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// `IsServiceAccountToken`'s cases (upstream's `TestIsServiceAccountToken`).
    #[test]
    fn which_secrets_are_an_accounts_tokens() {
        let s = |uid: &str| {
            secret(
                json!({NAME_ANNOTATION: "sa", UID_ANNOTATION: uid}),
                json!({}),
            )
        };
        assert!(is_token_of(&s("u1"), "sa", "u1"));
        assert!(is_token_of(&s(""), "sa", "u1"));
        assert!(!is_token_of(&s("u2"), "sa", "u1"));
        assert!(!is_token_of(&s("u1"), "other", "u1"));
        let mut opaque = s("u1");
        opaque.type_ = Some("Opaque".into());
        assert!(!is_token_of(&opaque, "sa", "u1"));
    }

    /// `secretUpdateNeeded` and what is written (upstream's `TestTokenCreation` cases "added
    /// token secret without token data", "... without ca data", "... with mismatched ca data",
    /// "... without namespace data" and the complete one).
    #[test]
    fn what_a_token_secret_gets() {
        let ca = b"CA";
        let full = json!({"token": b64("x"), "ca.crt": b64("CA"), "namespace": b64("ns")});
        assert!(!needs(&secret(json!({}), full.clone()), ca).any());
        let mut d = full.clone();
        d["token"] = json!("");
        assert_eq!(
            needs(&secret(json!({}), d), ca),
            Needs {
                token: true,
                ..Default::default()
            }
        );
        let mut d = full.clone();
        d.as_object_mut().unwrap().remove("ca.crt");
        assert_eq!(
            needs(&secret(json!({}), d.clone()), ca),
            Needs {
                ca: true,
                ..Default::default()
            }
        );
        // Without a bundle, a missing ca.crt is not needed.
        assert!(!needs(&secret(json!({}), d), b"").any());
        let mut d = full.clone();
        d["ca.crt"] = json!(b64("other"));
        assert!(needs(&secret(json!({}), d), ca).ca);
        let mut d = full;
        d.as_object_mut().unwrap().remove("namespace");
        assert!(needs(&secret(json!({}), d), ca).namespace);

        let sa: ServiceAccount = serde_json::from_value(json!({
            "metadata": {"name": "sa", "namespace": "ns", "uid": "u1"}}))
        .unwrap();
        let empty = secret(json!({NAME_ANNOTATION: "sa"}), json!({}));
        let want = needs(&empty, ca);
        assert_eq!(
            want,
            Needs {
                ca: true,
                namespace: true,
                token: true
            }
        );
        let out = filled(&empty, &sa, ca, want, Some("tok".into()));
        assert_eq!(bytes(&out, TOKEN_KEY), b"tok");
        assert_eq!(bytes(&out, CA_KEY), b"CA");
        assert_eq!(bytes(&out, NAMESPACE_KEY), b"ns");
        assert_eq!(annotation(&out, NAME_ANNOTATION), "sa");
        assert_eq!(annotation(&out, UID_ANNOTATION), "u1");
    }

    #[test]
    fn keys_round_trip() {
        let s = secret(
            json!({NAME_ANNOTATION: "sa", UID_ANNOTATION: "u1"}),
            json!({}),
        );
        assert_eq!(fields::<5>(&secret_key(&s)), ["ns", "t", "", "sa", "u1"]);
    }
}
