//! The namespace controller end to end against the reference control plane, once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), both
//! with `--controllers namespace-controller,serviceaccount-controller` (kube-controller-manager's
//! names, which ours takes too; the ServiceAccount controller so that the API server's admission
//! takes Pods). The same checks, with the same expected values, hold for both. No kubelet and no
//! scheduler run: the Pods are never bound, and an unbound Pod is deleted at once.
//!
//! - content: a namespace holding Pods, ConfigMaps, a Secret and two objects of a custom resource
//!   (a CRD made by the test) is deleted: everything in it goes and then the namespace itself
//!   (the `kubernetes` finalizer removed through the `finalize` subresource).
//! - finalizers: a namespace carrying a finalizer of its own (`example.com/keep`) and holding a
//!   custom object with a finalizer and a ConfigMap is deleted: the ConfigMap goes, the object
//!   stays, and the conditions NamespaceContentRemaining and NamespaceFinalizersRemaining say
//!   so with upstream's reasons and messages; once the test removes the object's finalizer, all
//!   five conditions turn to their "ok" variants, the `kubernetes` finalizer is removed and the
//!   namespace's own finalizer stays (so the namespace, still Terminating, can be read).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Flavour};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str = "namespace-controller,serviceaccount-controller";

/// Upstream looks at a deleted namespace 5 s after the event, and again 8 s after finding
/// content held by a finalizer.
const WAIT: Duration = Duration::from_secs(60);

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(200);

const GROUP: &str = "nstest.example.com";

fn start(flavour: Flavour) -> Cluster {
    Cluster::start_minimal(flavour, "namespace", CONTROLLERS)
}

fn widgets() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// The CRD of `widgets.nstest.example.com`, established.
async fn create_crd(cluster: &Cluster, client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = json!({
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    });
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    cluster
        .eventually("the CRD established", WAIT, POLL, || async {
            let crd = crds.get(&format!("widgets.{GROUP}")).await.unwrap();
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    // Served (discovery and the REST path) shortly after being established.
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &widgets());
    cluster
        .eventually("widgets served", WAIT, POLL, || async {
            api.list(&Default::default()).await.ok().map(|_| ())
        })
        .await;
}

/// A new namespace (with `finalizers` of its own) whose default ServiceAccount exists.
async fn create_namespace(cluster: &Cluster, client: &Client, name: &str, finalizers: &[&str]) {
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"finalizers": finalizers}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    cluster
        .eventually("the default ServiceAccount", WAIT, POLL, || async {
            sas.get_opt("default").await.unwrap()
        })
        .await;
}

async fn create<K>(client: &Client, ns: &str, v: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

async fn create_widget(client: &Client, ns: &str, name: &str, finalizers: &[&str]) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &widgets());
    let obj = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Widget",
        "metadata": {"name": name, "finalizers": finalizers}, "spec": {"size": 1}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
}

async fn content(cluster: &Cluster, client: &Client) {
    let ns = "content";
    create_namespace(cluster, client, ns, &[]).await;
    for i in 0..2 {
        create::<Pod>(
            client,
            ns,
            json!({"metadata": {"name": format!("pod-{i}")},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
        )
        .await;
        create::<ConfigMap>(
            client,
            ns,
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}}),
        )
        .await;
        create_widget(client, ns, &format!("widget-{i}"), &[]).await;
    }
    create::<Secret>(
        client,
        ns,
        json!({"metadata": {"name": "secret"}, "stringData": {"k": "v"}}),
    )
    .await;

    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete(ns, &DeleteParams::default()).await.unwrap();
    cluster
        .eventually("the namespace gone", WAIT, POLL, || async {
            nss.get_opt(ns).await.unwrap().is_none().then_some(())
        })
        .await;
    // Its content went with it (a namespace of the same name would find none of it).
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &widgets());
    let lp = Default::default();
    assert!(pods.list(&lp).await.unwrap().items.is_empty());
    assert!(cms.list(&lp).await.unwrap().items.is_empty());
    assert!(secrets.list(&lp).await.unwrap().items.is_empty());
    assert!(ws.list(&lp).await.unwrap().items.is_empty());
}

/// (type, status, reason, message) of each condition, in order.
fn conditions(ns: &Namespace) -> Vec<(String, String, String, String)> {
    ns.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            (
                c.type_,
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        })
        .collect()
}

fn c(t: &str, s: &str, r: &str, m: &str) -> (String, String, String, String) {
    (t.into(), s.into(), r.into(), m.into())
}

async fn finalizers(cluster: &Cluster, client: &Client) {
    let ns = "held";
    create_namespace(cluster, client, ns, &["example.com/keep"]).await;
    create_widget(client, ns, "held", &["example.com/hold"]).await;
    create::<ConfigMap>(client, ns, json!({"metadata": {"name": "cm"}})).await;

    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete(ns, &DeleteParams::default()).await.unwrap();
    let remaining = vec![
        c(
            "NamespaceDeletionDiscoveryFailure",
            "False",
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        c(
            "NamespaceDeletionGroupVersionParsingFailure",
            "False",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        c(
            "NamespaceDeletionContentFailure",
            "False",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        c(
            "NamespaceContentRemaining",
            "True",
            "SomeResourcesRemain",
            "Some resources are remaining: widgets.nstest.example.com has 1 resource instances",
        ),
        c(
            "NamespaceFinalizersRemaining",
            "True",
            "SomeFinalizersRemain",
            "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances",
        ),
    ];
    let seen = cluster
        .eventually("the remaining-content conditions", WAIT, POLL, || async {
            let n = nss.get(ns).await.unwrap();
            (conditions(&n) == remaining).then_some(n)
        })
        .await;
    assert_eq!(
        seen.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Terminating")
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    assert!(
        cms.get_opt("cm").await.unwrap().is_none(),
        "the ConfigMap remained"
    );
    let ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &widgets());
    let held = ws.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    // The finalizer removed: the object goes, the conditions turn ok, the namespace is released
    // by this controller and kept by its own finalizer.
    ws.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let ok = vec![
        remaining[0].clone(),
        remaining[1].clone(),
        remaining[2].clone(),
        c(
            "NamespaceContentRemaining",
            "False",
            "ContentRemoved",
            "All content successfully removed",
        ),
        c(
            "NamespaceFinalizersRemaining",
            "False",
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
    ];
    let released = cluster
        .eventually("the namespace released", WAIT, POLL, || async {
            let n = nss.get(ns).await.unwrap();
            let finalizers = n.spec.as_ref().and_then(|s| s.finalizers.clone());
            (finalizers == Some(vec!["example.com/keep".to_string()])).then_some(n)
        })
        .await;
    assert_eq!(conditions(&released), ok, "{:?}", cluster.flavour);
    assert!(ws.get_opt("held").await.unwrap().is_none());

    // Its own finalizer removed the same way: gone.
    let mut done = released.clone();
    done.spec.as_mut().unwrap().finalizers = Some(Vec::new());
    nss.replace_subresource("finalize", ns, &PostParams::default(), &done)
        .await
        .unwrap();
    cluster
        .eventually("the namespace gone", WAIT, POLL, || async {
            nss.get_opt(ns).await.unwrap().is_none().then_some(())
        })
        .await;
}

async fn scenario(flavour: Flavour) {
    let cluster = start(flavour);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    create_crd(&cluster, &client).await;
    let t0 = Instant::now();
    tokio::join!(content(&cluster, &client), finalizers(&cluster, &client));
    eprintln!("{flavour:?}: both namespaces done in {:?}", t0.elapsed());
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_namespace_deletion() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_namespace_deletion() {
    scenario(Flavour::Kpr).await;
}
