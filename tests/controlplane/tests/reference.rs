//! The reference control plane itself: it starts, serves the admin, authorizes by RBAC, restarts
//! its API server on the same etcd, and compacts etcd's history.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ListParams, PostParams};
use kube::Api;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_a_restricted_user_and_a_restart() {
    let dir = controlplane::run_dir("reference-test");
    let mut cp = controlplane::ControlPlane::start(controlplane::Options::minimal(&dir)).unwrap();
    let client = cp.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");

    // A user without any binding is refused by the RBAC authorizer.
    let nobody = cp.kubeconfig_for_user("nobody", None).unwrap();
    let nobody = controlplane::client_from(&nobody).await.unwrap();
    let err = Api::<ConfigMap>::namespaced(nobody, "default")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("forbidden"), "{err}");

    // The API server restarts on the same etcd: what was written is still there.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"a": "b"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cp.stop_apiserver();
    assert!(cms.get("kept").await.is_err(), "the API server is down");
    cp.start_apiserver().unwrap();
    let client = cp.client().await.unwrap();
    let kept = Api::<ConfigMap>::namespaced(client, "default")
        .get("kept")
        .await
        .unwrap();
    assert_eq!(kept.data.unwrap()["a"], "b");
    assert!(cp.compact_etcd().unwrap() > 1);
    let version = cp.kubectl_run(&["version", "-o", "json"], None).unwrap();
    assert!(
        version.contains(controlplane::kubernetes_version()),
        "{version}"
    );
    assert_eq!(controlplane::kubernetes_version(), "v1.34.4");
}
