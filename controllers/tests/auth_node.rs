//! The auth and node groups' controllers (serviceaccount, root-ca-cert-publisher,
//! taint-eviction-controller) end to end against the reference control plane, once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), both
//! with `--controllers` naming those three (kube-controller-manager's names, which ours takes too)
//! and `--root-ca-file` the control plane's CA. The same checks hold for both; no kubelet and no
//! scheduler run: the Nodes are API objects and the Pods are bound by `spec.nodeName`, so a
//! deleted Pod stays, terminating, with its deletionTimestamp (nothing confirms its end).
//!
//! - namespaces: a new namespace gets the `default` ServiceAccount (so the API server's
//!   ServiceAccount admission takes its Pods) and the `kube-root-ca.crt` ConfigMap (`ca.crt` the
//!   CA file's bytes, the description annotation); both come back when deleted; the ConfigMap's
//!   data is put back when edited.
//! - taints: a Pod not tolerating a NoExecute taint is evicted at once, with the DisruptionTarget
//!   condition and the "Marking for deletion" Event; one tolerating it for 4 s is still there
//!   after 3 s and evicted after; one tolerating it for ever stays; on a second Node, a Pod
//!   tolerating the taint for 6 s is not evicted when the taint goes after 1 s, and the
//!   "Cancelling deletion" Event says so.
//!
//! kube-controller-manager runs node-lifecycle-controller as well: its taint eviction controller
//! finds a Node's Pods through the `spec.nodeName` index that the node lifecycle controller adds
//! to the shared Pod informer, and started without it, every Node change fails with "Index with
//! name spec.nodeName does not exist" (so no Pod is evicted when a Node is tainted). Ours keeps
//! an index of its own. The node lifecycle controller leaves the Nodes alone within the test
//! (it marks a Node that never reported unreachable only after its 50 s grace period).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::time::{Duration, Instant};

use common::events::recorded_by;
use common::{Cluster, Flavour};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str =
    "serviceaccount-controller,root-ca-certificate-publisher-controller,taint-eviction-controller";

const WAIT: Duration = Duration::from_secs(30);

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(100);

const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";

fn start(flavour: Flavour) -> Cluster {
    let controllers = match flavour {
        Flavour::Upstream => format!("{CONTROLLERS},node-lifecycle-controller"),
        Flavour::Kpr => CONTROLLERS.to_string(),
    };
    Cluster::start_minimal(flavour, "auth-node", &controllers)
}

async fn namespaces(cluster: &Cluster, client: &Client) {
    let ca = std::fs::read_to_string(&cluster.cp().pki.ca_cert).unwrap();
    let ns_name = "auth-scenario";
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns_name}})).unwrap(),
    )
    .await
    .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns_name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns_name);
    let first = cluster
        .eventually("the default ServiceAccount", WAIT, POLL, || async {
            sas.get_opt("default").await.unwrap()
        })
        .await;
    let published = |want_ca: String| {
        let cms = cms.clone();
        move || {
            let (cms, want_ca) = (cms.clone(), want_ca.clone());
            async move {
                let cm = cms.get_opt("kube-root-ca.crt").await.unwrap()?;
                let data = cm.data.clone().unwrap_or_default();
                let described = cm
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
                    .is_some_and(|d| d.starts_with("Contains a CA bundle"));
                (data.len() == 1 && data.get("ca.crt") == Some(&want_ca) && described).then_some(cm)
            }
        }
    };
    let cm = cluster
        .eventually(
            "kube-root-ca.crt with the CA",
            WAIT,
            POLL,
            published(ca.clone()),
        )
        .await;

    // Deleted: both come back (new objects).
    sas.delete("default", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("the default ServiceAccount again", WAIT, POLL, || async {
            let sa = sas.get_opt("default").await.unwrap()?;
            (sa.metadata.uid != first.metadata.uid).then_some(())
        })
        .await;
    cms.delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    let again = cluster
        .eventually("kube-root-ca.crt again", WAIT, POLL, published(ca.clone()))
        .await;
    assert_ne!(again.metadata.uid, cm.metadata.uid);

    // Edited: the data is put back whole.
    cms.patch(
        "kube-root-ca.crt",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"ca.crt": "tampered", "extra": "x"}})),
    )
    .await
    .unwrap();
    cluster
        .eventually("kube-root-ca.crt repaired", WAIT, POLL, published(ca))
        .await;
}

fn pod(name: &str, node: &str, tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "tolerations": tolerations,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap()
}

fn tolerate(seconds: Option<i64>) -> serde_json::Value {
    let mut t = json!({"key": "example.com/evict", "operator": "Exists", "effect": "NoExecute"});
    if let Some(s) = seconds {
        t["tolerationSeconds"] = json!(s);
    }
    json!([t])
}

async fn taint(nodes: &Api<Node>, node: &str, on: bool) {
    let taints = if on {
        json!([{"key": "example.com/evict", "value": "yes", "effect": "NoExecute"}])
    } else {
        json!([])
    };
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
}

fn deleting(p: &Option<Pod>) -> bool {
    p.as_ref()
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

async fn messages(events: &Api<Event>, pod: &str) -> Vec<String> {
    let fields =
        format!("involvedObject.kind=Pod,involvedObject.name={pod},reason=TaintManagerEviction");
    recorded_by(events, &fields, "taint-eviction-controller")
        .await
        .into_iter()
        .filter_map(|e| e.message)
        .collect()
}

async fn taints(cluster: &Cluster, client: &Client) {
    let ns = "taint-scenario";
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["evicting", "relenting"] {
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    // The ServiceAccount admission takes Pods once the default ServiceAccount exists.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    cluster
        .eventually("the default ServiceAccount", WAIT, POLL, || async {
            sas.get_opt("default").await.unwrap()
        })
        .await;
    let pp = PostParams::default();
    for p in [
        pod("untolerating", "evicting", json!([])),
        pod("four-seconds", "evicting", tolerate(Some(4))),
        pod("for-ever", "evicting", tolerate(None)),
        pod("reprieved", "relenting", tolerate(Some(6))),
    ] {
        pods.create(&pp, &p).await.unwrap();
    }

    taint(&nodes, "evicting", true).await;
    taint(&nodes, "relenting", true).await;
    let t0 = Instant::now();
    let evicted = cluster
        .eventually("the untolerating Pod evicted", WAIT, POLL, || async {
            let p = pods.get_opt("untolerating").await.unwrap();
            deleting(&p).then_some(p)
        })
        .await
        .expect("a bound Pod stays, terminating");
    let condition = evicted
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("the DisruptionTarget condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("True", Some("DeletionByTaintManager"))
    );
    assert_eq!(
        condition.message.as_deref(),
        Some("Taint manager: deleting due to NoExecute taint")
    );

    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(t0.elapsed())).await;
    taint(&nodes, "relenting", false).await;

    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed())).await;
    assert!(
        !deleting(&pods.get_opt("four-seconds").await.unwrap()),
        "{:?}: a Pod tolerating the taint for 4 s was evicted within 3 s",
        cluster.flavour
    );
    cluster
        .eventually("the four-seconds Pod evicted", WAIT, POLL, || async {
            deleting(&pods.get_opt("four-seconds").await.unwrap()).then_some(())
        })
        .await;

    tokio::time::sleep(Duration::from_secs(9).saturating_sub(t0.elapsed())).await;
    assert!(
        !deleting(&pods.get_opt("for-ever").await.unwrap()),
        "{:?}: a Pod tolerating the taint for ever was evicted",
        cluster.flavour
    );
    assert!(
        !deleting(&pods.get_opt("reprieved").await.unwrap()),
        "{:?}: the taint went after 1 s, yet the Pod tolerating it for 6 s was evicted",
        cluster.flavour
    );

    for (pod, want) in [
        (
            "untolerating",
            "Marking for deletion Pod taint-scenario/untolerating",
        ),
        (
            "four-seconds",
            "Marking for deletion Pod taint-scenario/four-seconds",
        ),
        (
            "reprieved",
            "Cancelling deletion of Pod taint-scenario/reprieved",
        ),
    ] {
        cluster
            .eventually(&format!("the Event {want:?}"), WAIT, POLL, || async {
                messages(&events, pod)
                    .await
                    .iter()
                    .any(|m| m == want)
                    .then_some(())
            })
            .await;
    }
    assert!(
        messages(&events, "for-ever").await.is_empty(),
        "{:?}: Events about the Pod tolerating for ever",
        cluster.flavour
    );
}

async fn scenario(flavour: Flavour) {
    let cluster = start(flavour);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    namespaces(&cluster, &client).await;
    taints(&cluster, &client).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_auth_and_taint_eviction() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_auth_and_taint_eviction() {
    scenario(Flavour::Kpr).await;
}
