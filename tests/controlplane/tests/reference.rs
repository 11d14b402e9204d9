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

/// The whole reference cluster `cargo xtask cluster up --kwok-nodes 2` starts: a Deployment
/// becomes Running Pods on kwok nodes (kube-controller-manager made them, kube-scheduler placed
/// them, kwok ran them) and its Service gets an EndpointSlice with their addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_controllers_scheduler_and_kwok_run_a_deployment() {
    let opts = controlplane::Options {
        upstream_controllers: Some("*".into()),
        upstream_scheduler: true,
        kwok_nodes: 2,
        ..controlplane::Options::minimal(controlplane::run_dir("reference-kwok"))
    };
    let cp = controlplane::ControlPlane::start(opts).unwrap();
    cp.kubectl_run(
        &[
            "create",
            "deployment",
            "web",
            "--image=busybox",
            "--replicas=3",
        ],
        None,
    )
    .unwrap();
    cp.kubectl_run(&["expose", "deployment", "web", "--port=80"], None)
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let pods = cp
            .kubectl_run(
                &[
                    "get",
                    "pods",
                    "-l",
                    "app=web",
                    "-o",
                    "jsonpath={range .items[*]}{.status.phase}/{.spec.nodeName} {end}",
                ],
                None,
            )
            .unwrap();
        let slices = cp
            .kubectl_run(
                &[
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=web",
                    "-o",
                    "jsonpath={.items[*].endpoints[*].addresses[0]}",
                ],
                None,
            )
            .unwrap();
        let running = pods
            .split_whitespace()
            .filter(|p| p.starts_with("Running/kwok-node-"))
            .count();
        if running == 3 && slices.split_whitespace().count() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pods {pods:?}, slice addresses {slices:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
