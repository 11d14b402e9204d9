//! The bootstrap signer (kube-controller-manager v1.34's `bootstrap-signer-controller`, alias
//! `bootstrapsigner`, `pkg/controller/bootstrap/bootstrapsigner.go`; off by default, as upstream:
//! kubeadm turns it on): signs the `kubeconfig` of the `cluster-info` ConfigMap in `kube-public`
//! with every bootstrap token that may sign ([`crate::helpers::bootstraptoken::for_signing`]),
//! so that a joining node holding a token can trust the cluster CA it reads there. Each
//! signature is a detached JWS (HS256, the token's secret the key, its ID the `kid`) under
//! `jws-kubeconfig-<token-id>`; signatures of tokens that are gone, expired or no longer for
//! signing are removed.
//!
//! Owns: the `jws-kubeconfig-*` keys of that one ConfigMap (other keys stay). One key in one
//! work queue (`bootstrap_signer_queue`), added whenever a bootstrap token Secret of
//! `kube-system` changes and whenever the ConfigMap is added or updated. A failed update is not
//! retried (upstream logs it; the next change tries again).
//!
//! Difference from upstream: the ConfigMap is watched by a watch of its own (a field selector on
//! its name in `kube-public`) and read with a GET at each sync, because the shared ConfigMap
//! informer watches only `kube-root-ca.crt` (root-ca-cert-publisher's restriction); upstream
//! reads it from the informer of every ConfigMap.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::error::Result;
use crate::helpers::bootstraptoken;
use crate::helpers::clock::{Clock, SystemClock};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{watcher_config, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs.
pub const NAME: &str = "bootstrapsigner";
/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "bootstrap_signer_queue";
/// The ConfigMap signed (`ConfigMapClusterInfo` in `kube-public`).
pub const CONFIG_MAP_NAMESPACE: &str = "kube-public";
pub const CONFIG_MAP: &str = "cluster-info";
/// The signed key (`KubeConfigKey`) and the signatures' key prefix (`JWSSignatureKeyPrefix`).
pub const KUBECONFIG_KEY: &str = "kubeconfig";
pub const SIGNATURE_PREFIX: &str = "jws-kubeconfig-";

/// `jws.ComputeDetachedSignature`: the compact JWS of `content` signed with HMAC-SHA256 under
/// `secret`, header `{"alg":"HS256","kid":"<id>"}` (go-jose's, keys in order), without its
/// payload: `<header>..<signature>`.
pub fn detached_signature(content: &str, id: &str, secret: &str) -> String {
    let header = serde_json::json!({"alg": "HS256", "kid": id}).to_string();
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.as_bytes()),
        URL_SAFE_NO_PAD.encode(content.as_bytes())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, signing_input.as_bytes());
    let header_b64 = signing_input.split('.').next().unwrap_or_default();
    format!("{header_b64}..{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// `signConfigMap`'s decision: the ConfigMap's data with a signature for each of `tokens` (ID ->
/// secret) and no other `jws-kubeconfig-*` key, or `None` when it already is so or has no
/// `kubeconfig` key.
pub fn plan(cm: &ConfigMap, tokens: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    let mut data = cm.data.clone().unwrap_or_default();
    let content = data.get(KUBECONFIG_KEY)?.clone();
    let mut old: BTreeMap<String, String> = BTreeMap::new();
    data.retain(|k, v| match k.strip_prefix(SIGNATURE_PREFIX) {
        Some(id) => {
            old.insert(id.to_string(), v.clone());
            false
        }
        None => true,
    });
    let mut changed = false;
    for (id, secret) in tokens {
        let sig = detached_signature(&content, id, secret);
        if old.remove(id).as_ref() != Some(&sig) {
            changed = true;
        }
        data.insert(format!("{SIGNATURE_PREFIX}{id}"), sig);
    }
    (changed || !old.is_empty()).then_some(data)
}

/// The running controller.
pub struct Controller {
    client: Client,
    secrets: Arc<Indexed<Secret>>,
    queue: Arc<WorkQueue<String>>,
    clock: Arc<dyn Clock>,
}

/// The queue's one key.
fn key() -> String {
    format!("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}")
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
        // A token Secret added, updated or deleted: the signatures may change.
        secrets.on_change_of(&this, |c, old, new| {
            if old
                .or(new)
                .is_some_and(|s| bootstraptoken::is_token_secret(s))
            {
                c.queue.add(key());
            }
        });
        this
    }

    /// Watches the ConfigMap, waits for the Secret cache, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), CONFIG_MAP_NAMESPACE);
        let cfg = watcher_config().fields(&format!("metadata.name={CONFIG_MAP}"));
        let queue = self.queue.clone();
        let watch = async move {
            let mut events = std::pin::pin!(watcher(api, cfg));
            while let Some(ev) = events.next().await {
                match ev {
                    // Added or updated (a re-listing included): upstream's Add/Update handlers.
                    Ok(watcher::Event::Apply(_) | watcher::Event::InitApply(_)) => queue.add(key()),
                    Ok(_) => {}
                    Err(e) => tracing::debug!(controller = NAME, "cluster-info watch: {e}"),
                }
            }
        };
        let caches: [&dyn crate::runtime::workers::Synced; 1] = [&*self.secrets];
        let workers = run_controller(&self, NAME, &caches, &self.queue, 1);
        tokio::join!(watch, workers);
    }

    /// Stops the worker.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    /// `signConfigMap`.
    async fn sync(&self, _key: &str) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), CONFIG_MAP_NAMESPACE);
        let cm = match api.get_opt(CONFIG_MAP).await {
            Ok(Some(cm)) => cm,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing::error!(controller = NAME, "reading {CONFIG_MAP}: {e}");
                return Ok(());
            }
        };
        let now: Timestamp = self.clock.now();
        let secrets = self.secrets.all();
        let tokens = bootstraptoken::signing_tokens(secrets.iter().map(|s| &**s), now);
        let Some(data) = plan(&cm, &tokens) else {
            return Ok(());
        };
        let mut signed = cm;
        signed.data = Some(data);
        match api
            .replace(CONFIG_MAP, &PostParams::default(), &signed)
            .await
        {
            Ok(_) => tracing::info!(
                controller = NAME,
                tokens = tokens.len(),
                "signed {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}"
            ),
            Err(e) if apierrors::is_conflict(&e) || apierrors::is_not_found(&e) => {}
            Err(e) => tracing::warn!(controller = NAME, "updating {CONFIG_MAP}: {e}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Upstream's `TestComputeDetachedSignature` vectors (cluster-bootstrap's jws_test.go).
    #[test]
    fn upstream_jws_vectors() {
        let content = "Hello from the other side. I must have called a thousand times.";
        let secret = "my voice is my passcode";
        assert_eq!(
            detached_signature(content, "joshua", secret),
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..VShe2taLd-YTrmWuRkcL_8QTNDHYxQIEBsAYYiIj1_8"
        );
        assert_eq!(
            detached_signature("", "joshua", secret),
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..7Ui1ALizW4jXphVUB7xUqC9vLYLL9RZeOFfVLoB7Tgk"
        );
        assert_eq!(
            detached_signature(content, "joshua", ""),
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..UfkqvDGiIFxrMnFseDj9LYJOLNrvjW8aHhF71mvvAs8"
        );
    }

    fn cm(data: serde_json::Value) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": CONFIG_MAP, "namespace": CONFIG_MAP_NAMESPACE},
            "data": data}))
        .unwrap()
    }

    fn tokens(t: &[(&str, &str)]) -> BTreeMap<String, String> {
        t.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// Upstream's `TestNoConfigMap`, `TestSimpleSign`, `TestNoSignNeeded`, `TestUpdateSignature`
    /// and `TestRemoveSignature`.
    #[test]
    fn upstream_signer_cases() {
        let t = tokens(&[("abc123", "tokenSecret")]);
        let sig = detached_signature("kubeconfig data", "abc123", "tokenSecret");
        // Signs.
        let got = plan(&cm(json!({"kubeconfig": "kubeconfig data"})), &t).unwrap();
        assert_eq!(got["jws-kubeconfig-abc123"], sig);
        assert_eq!(got["kubeconfig"], "kubeconfig data");
        // Already signed: nothing.
        assert_eq!(
            plan(
                &cm(json!({"kubeconfig": "kubeconfig data", "jws-kubeconfig-abc123": sig})),
                &t
            ),
            None
        );
        // A wrong signature is replaced.
        let got = plan(
            &cm(json!({"kubeconfig": "kubeconfig data", "jws-kubeconfig-abc123": "old"})),
            &t,
        )
        .unwrap();
        assert_eq!(got["jws-kubeconfig-abc123"], sig);
        // A signature without its token is removed; other keys stay.
        let got = plan(
            &cm(
                json!({"kubeconfig": "kubeconfig data", "jws-kubeconfig-abc123": sig,
                       "other": "x"}),
            ),
            &tokens(&[]),
        )
        .unwrap();
        assert_eq!(
            got,
            tokens(&[("kubeconfig", "kubeconfig data"), ("other", "x")])
        );
        // No kubeconfig key: nothing.
        assert_eq!(plan(&cm(json!({"other": "x"})), &t), None);
    }
}
