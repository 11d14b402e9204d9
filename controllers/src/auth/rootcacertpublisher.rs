//! The root CA certificate publisher (kube-controller-manager v1.34's
//! `root-ca-certificate-publisher-controller`, alias `root-ca-cert-publisher`,
//! `pkg/controller/certificates/rootcacertpublisher`): the `kube-root-ca.crt` ConfigMap in every
//! namespace, its `ca.crt` the cluster CA of `--root-ca-file` (the file's bytes), with the
//! `kubernetes.io/description` annotation upstream writes. The API server's projected
//! ServiceAccount token volumes read `ca.crt` from it, so without it no Pod with a token volume
//! starts.
//!
//! Owns: that one ConfigMap per namespace: created when missing, its data and annotation put
//! back when changed (other keys and annotations are left alone; `data` is replaced whole, as
//! upstream). A namespace is synced when added, when updated while Active, and when its
//! ConfigMap is updated or deleted; a create refused because the namespace is gone or
//! terminating is not retried. Only ConfigMaps of that name are watched (a field selector), so the
//! cache holds one per namespace rather than every ConfigMap of the cluster. One worker, as
//! kube-controller-manager runs it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
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
pub const NAME: &str = "root-ca-cert-publisher";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "root_ca_cert_publisher";

/// The ConfigMap's name (`RootCACertConfigMapName`).
pub const CONFIG_MAP: &str = "kube-root-ca.crt";

/// What the ConfigMap informer watches.
const FIELD_SELECTOR: &str = "metadata.name=kube-root-ca.crt";

/// The key of the CA in it.
pub const CA_KEY: &str = "ca.crt";

/// The annotation describing it, and its text, as upstream.
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver \
     when using internal endpoints such as the internal service IP or kubernetes.default.svc. No \
     other usage is guaranteed across distributions of Kubernetes clusters.";

/// The controller's settings.
#[derive(Clone)]
pub struct Config {
    /// The CA bundle, PEM, as read from the file.
    pub root_ca: String,
    /// Workers (kube-controller-manager runs one).
    pub workers: usize,
}

impl Config {
    /// The CA of `--root-ca-file`, checked to hold PEM certificates as upstream's `readCA` does
    /// (an unreadable file, or one without a certificate, is an error naming it).
    pub fn from_file(path: &Path) -> Result<Config> {
        let invalid = |reason: String| Error::Invalid {
            object: format!("--root-ca-file {}", path.display()),
            reason,
        };
        let pem = std::fs::read_to_string(path).map_err(|e| invalid(format!("reading: {e}")))?;
        check_pem_certificates(&pem)
            .map_err(|e| invalid(format!("error parsing root-ca-file: {e}")))?;
        Ok(Config {
            root_ca: pem,
            workers: 1,
        })
    }
}

/// Whether `pem` holds at least one certificate block (`-----BEGIN CERTIFICATE-----` ...
/// `-----END CERTIFICATE-----` around base64) and every block is closed. The certificates' DER is
/// not parsed (upstream parses it with crypto/x509).
pub fn check_pem_certificates(pem: &str) -> std::result::Result<(), String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut found = 0;
    let mut rest = pem;
    while let Some(i) = rest.find(BEGIN) {
        let after = &rest[i + BEGIN.len()..];
        let end = after
            .find(END)
            .ok_or_else(|| format!("certificate {} has no {END} line", found + 1))?;
        let body: String = after[..end].split_whitespace().collect();
        if body.is_empty()
            || !body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        {
            return Err(format!("certificate {} is not base64", found + 1));
        }
        found += 1;
        rest = &after[end + END.len()..];
    }
    if found == 0 {
        return Err("data does not contain any valid RSA or ECDSA certificates".into());
    }
    Ok(())
}

/// What the namespace's ConfigMap should become: `None` when it is right (its data exactly the
/// CA, the description annotation not empty), otherwise the ConfigMap to write back.
pub fn repaired(cm: &ConfigMap, root_ca: &str) -> Option<ConfigMap> {
    let want: BTreeMap<String, String> = [(CA_KEY.to_string(), root_ca.to_string())].into();
    let described = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
        .is_some_and(|d| !d.is_empty());
    if cm.data.as_ref() == Some(&want) && described {
        return None;
    }
    let mut out = cm.clone();
    out.data = Some(want);
    out.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into());
    Some(out)
}

/// The ConfigMap a namespace gets.
pub fn config_map(root_ca: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            annotations: Some([(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into())].into()),
            ..Default::default()
        },
        data: Some([(CA_KEY.to_string(), root_ca.to_string())].into()),
        ..Default::default()
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    config_maps: Arc<Indexed<ConfigMap>>,
    namespaces: Arc<Indexed<Namespace>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the shared Namespace informer and the ConfigMap
    /// informer (restricted to `kube-root-ca.crt`; an error if another controller restricted it
    /// otherwise).
    pub fn new(client: Client, informers: &Informers, config: Config) -> Result<Arc<Controller>> {
        let cm_informer = informers.get::<ConfigMap>();
        cm_informer.restrict_fields(FIELD_SELECTOR)?;
        let ns_informer = informers.get::<Namespace>();
        let this = Arc::new(Controller {
            client,
            config,
            config_maps: cm_informer.cache(),
            namespaces: ns_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        // Updated or deleted (not added: that is this controller's own create).
        cm_informer.on_change_of(&this, |c, old, new| {
            let Some(cm) = (match (old, new) {
                (Some(_), Some(n)) => Some(n),
                (Some(o), None) => Some(o),
                _ => None,
            }) else {
                return;
            };
            if cm.metadata.name.as_deref() == Some(CONFIG_MAP) {
                if let Some(ns) = cm.metadata.namespace.clone() {
                    c.queue.add(ns);
                }
            }
        });
        // Added, or updated while Active.
        ns_informer.on_change_of(&this, |c, old, new| {
            let Some(ns) = new else { return };
            if old.is_some() && !meta::namespace_is_active(ns) {
                return;
            }
            if let Some(name) = ns.metadata.name.clone() {
                c.queue.add(name);
            }
        });
        Ok(this)
    }

    /// Waits for the caches, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.config_maps, &*self.namespaces],
            &self.queue,
            self.config.workers,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    /// `syncNamespace`: creates the namespace's ConfigMap, or puts its CA and annotation back.
    async fn sync(&self, ns: &str) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let object = || format!("ConfigMap {ns}/{CONFIG_MAP}");
        let Some(cm) = self.config_maps.get(ns, CONFIG_MAP) else {
            return match api
                .create(&PostParams::default(), &config_map(&self.config.root_ca))
                .await
            {
                Ok(_) => Ok(()),
                // The namespace is gone or being deleted: nothing to retry.
                Err(e) if apierrors::is_not_found(&e) || apierrors::namespace_terminating(&e) => {
                    Ok(())
                }
                Err(e) => Err(Error::kube("creating", object(), e)),
            };
        };
        let Some(fixed) = repaired(&cm, &self.config.root_ca) else {
            return Ok(());
        };
        api.replace(CONFIG_MAP, &PostParams::default(), &fixed)
            .await
            .map(|_| ())
            .map_err(|e| Error::kube("updating", object(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CA: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUX0==\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_ca_file_must_hold_certificates() {
        assert!(check_pem_certificates(CA).is_ok());
        assert!(check_pem_certificates(&format!("{CA}{CA}")).is_ok());
        assert!(check_pem_certificates("").is_err());
        assert!(check_pem_certificates("-----BEGIN CERTIFICATE-----\nabc").is_err());
        assert!(check_pem_certificates(
            "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"
        )
        .is_err());
        let dir = std::env::temp_dir().join(format!("kpr-rootca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.crt");
        std::fs::write(&bad, "not a certificate").unwrap();
        let err = Config::from_file(&bad).err().unwrap().to_string();
        assert!(
            err.contains("bad.crt") && err.contains("root-ca-file"),
            "{err}"
        );
        let good = dir.join("ca.crt");
        std::fs::write(&good, CA).unwrap();
        assert_eq!(
            Config::from_file(&good).unwrap().root_ca,
            CA,
            "the file's bytes"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_changed_config_map_gets_its_ca_and_annotation_back() {
        let cm = |v: serde_json::Value| -> ConfigMap { serde_json::from_value(v).unwrap() };
        let right = config_map(CA);
        assert_eq!(repaired(&right, CA), None, "as created: nothing to do");
        let cases = [
            (
                "another CA",
                json!({"metadata": {"name": CONFIG_MAP,
                "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION}}, "data": {CA_KEY: "old"}}),
            ),
            (
                "an extra key",
                json!({"metadata": {"name": CONFIG_MAP,
                "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION}}, "data": {CA_KEY: CA, "x": "y"}}),
            ),
            (
                "no annotation",
                json!({"metadata": {"name": CONFIG_MAP}, "data": {CA_KEY: CA}}),
            ),
            (
                "an empty annotation",
                json!({"metadata": {"name": CONFIG_MAP,
                "annotations": {DESCRIPTION_ANNOTATION: ""}}, "data": {CA_KEY: CA}}),
            ),
        ];
        for (what, v) in cases {
            let fixed = repaired(&cm(v), CA).unwrap_or_else(|| panic!("{what}: left as it is"));
            assert_eq!(fixed.data, right.data, "{what}");
            assert_eq!(
                fixed.metadata.annotations.unwrap()[DESCRIPTION_ANNOTATION],
                DESCRIPTION,
                "{what}"
            );
        }
        // Another annotation with a description of the user's own stays as it is.
        let described = cm(json!({"metadata": {"name": CONFIG_MAP,
            "annotations": {DESCRIPTION_ANNOTATION: "mine", "other": "x"}}, "data": {CA_KEY: CA}}));
        assert_eq!(repaired(&described, CA), None);
    }
}
