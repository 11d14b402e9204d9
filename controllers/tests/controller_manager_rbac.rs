//! The `controller-manager` binary under exactly the ServiceAccount and RBAC of
//! deploy/controller-manager.yaml, against the reference kube-apiserver (its RBAC authorizer
//! decides): the manifest is applied with `kubectl apply -f`, a token of its ServiceAccount is
//! requested, and the binary runs with that token, every controller (endpointslice, endpoints,
//! lb-ipam, replicaset, deployment, garbagecollector, job, cronjob, ttl-after-finished, statefulset,
//! daemonset, serviceaccount, root-ca-cert-publisher, taint-eviction-controller, namespace,
//! resourcequota, the seven volume controllers, resourceclaim, clusterrole-aggregation, ttl, nodelifecycle,
//! csrapproving, csrsigning, csrcleaner, endpointslicemirroring, service-cidr,
//! validatingadmissionpolicy-status, serviceaccount-token, legacy-serviceaccount-token-cleaner,
//! bootstrapsigner, tokencleaner) and leader election. It writes EndpointSlices and Endpoints, assigns a LoadBalancer address,
//! updates both when a Pod turns unready, releases the address and deletes the slices of a
//! deleted LoadBalancer Service, mirrors a selectorless Service's Endpoints, puts its finalizer on
//! the default ServiceCIDR, observes a ValidatingAdmissionPolicy's generation, runs a Deployment's ReplicaSet and Pods and collects them when
//! it is deleted, holds the Lease, and releases it on SIGTERM; nothing it does is denied (the log
//! is searched for any refusal), and endpoints carry their Node's zone.
//!
//! The manifest's Deployment is created too, but nothing runs it (no kube-controller-manager, no
//! kubelet): the binary runs here, as a process of the test, with the Deployment's ServiceAccount.
//! The binary is the one cargo builds for this package's integration tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

mod common;

use controllers::endpoint::lbipam;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
    ResourceQuota, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(60);
/// Namespace and name of the ServiceAccount, the Lease and the Deployment in the manifest.
const SYSTEM: &str = "kube-system";
const ACCOUNT: &str = "kpr-controller-manager";
const POOL: &str = "198.51.100.0/29";

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    common::wait::eventually(what, WAIT, Duration::from_millis(100), |m| m, check).await
}

async fn lease_holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), SYSTEM)
        .get_opt(ACCOUNT)
        .await
        .unwrap()?;
    lease.spec?.holder_identity
}

fn spawn(
    binary: &Path,
    kubeconfig: &Path,
    ca: &Path,
    ca_key: &Path,
    sa_key: &Path,
    log: &Path,
) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    Command::new(binary)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args([
            "--controllers",
            "endpointslice,endpoints,lb-ipam,replicaset,deployment,garbagecollector,job,cronjob,ttl-after-finished,statefulset,daemonset,serviceaccount,root-ca-cert-publisher,taint-eviction-controller,namespace,resourcequota,persistentvolume-binder,persistentvolume-protection,persistentvolumeclaim-protection,ephemeral-volume,persistentvolume-expander,volumeattributesclass-protection,persistentvolume-attach-detach,resourceclaim,clusterrole-aggregation,ttl,nodelifecycle,csrapproving,csrsigning,csrcleaner,endpointslicemirroring,service-cidr,validatingadmissionpolicy-status,serviceaccount-token,legacy-serviceaccount-token-cleaner,bootstrapsigner,tokencleaner",
        ])
        .args(["--service-account-private-key-file", sa_key.to_str().unwrap()])
        .args(["--root-ca-file", ca.to_str().unwrap()])
        .args(["--cluster-signing-cert-file", ca.to_str().unwrap()])
        .args(["--cluster-signing-key-file", ca_key.to_str().unwrap()])
        .args(["--lb-pool", POOL])
        .args(["--leader-elect", "--leader-elect-identity", "cm-rbac"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .expect("spawning controller-manager")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_manager_runs_with_the_manifests_service_account_and_rbac() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_controller-manager"));
    let cp = controlplane::shared().unwrap();
    let admin = cp.client().await.unwrap();
    // The controller-manager panicking fails the test, caught and retried or not.
    let panics =
        cp.panic_guard("controller_manager_runs_with_the_manifests_service_account_and_rbac");

    // The manifest as it is deployed: ServiceAccount, ClusterRole and binding, Role and binding
    // for the Lease, Deployment (stored; nothing runs its Pod here).
    let manifest = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/controller-manager.yaml"
    );
    cp.kubectl_run(&["apply", "-f", manifest], None).unwrap();
    let deployment = Api::<Deployment>::namespaced(admin.clone(), SYSTEM)
        .get(ACCOUNT)
        .await
        .unwrap();
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod_spec.service_account_name.as_deref(), Some(ACCOUNT));

    let token = cp.service_account_token(SYSTEM, ACCOUNT).unwrap();
    let kubeconfig = cp
        .kubeconfig_for_token(
            "kpr-controller-manager.kubeconfig",
            &token,
            &cp.server_url(),
        )
        .unwrap();
    let account = controlplane::client_from(&kubeconfig).await.unwrap();

    // The workload: a Node with a zone, a Service with a Ready Pod on it (status written as its
    // kubelet would), and a LoadBalancer Service.
    let ns = cp.test_namespace("cm-rbac").unwrap();
    let node = format!("{ns}-node");
    let n: Node = serde_json::from_value(json!({"metadata": {"name": node,
        "labels": {"topology.kubernetes.io/zone": "zone-a"}}}))
    .unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    for (name, kind) in [("web", "ClusterIP"), ("lb", "LoadBalancer")] {
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"type": kind, "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-0", "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/app:1",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ip = "10.244.7.7";
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("web-0", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();

    // The real authorizer, asked as the ServiceAccount: Nodes may be listed, Secrets may not.
    Api::<Node>::all(account.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let err = Api::<k8s_openapi::api::core::v1::Secret>::all(account.clone())
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "listing Secrets as the controller-manager's ServiceAccount: {err}"
    );

    // Where kpr runs the workload controllers, their RBAC is applied too (the garbage collector's
    // reads every kind, Secrets included).
    let workload_manifest = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/workload-controllers.yaml"
    );
    cp.kubectl_run(&["apply", "-f", workload_manifest], None)
        .unwrap();

    let log = cp
        .dir
        .join("logs")
        .join(format!("controller-manager-{ns}.log"));
    let mut cm = spawn(
        &binary,
        &kubeconfig,
        &cp.pki.ca_cert,
        &cp.pki.ca_key,
        &cp.pki.sa_key,
        &log,
    );
    let shown_log = || std::fs::read_to_string(&log).unwrap_or_default();

    eventually("the Lease held by cm-rbac", || async {
        (lease_holder(&admin).await.as_deref() == Some("cm-rbac")).then_some(())
    })
    .await;
    // root-ca-cert-publisher, under the manifest's RBAC: the namespace's kube-root-ca.crt.
    eventually("kube-root-ca.crt in the test namespace", || async {
        Api::<ConfigMap>::namespaced(admin.clone(), &ns)
            .get_opt("kube-root-ca.crt")
            .await
            .unwrap()
    })
    .await;
    // serviceaccount-token, under the manifest's RBAC: a token Secret of an account is filled;
    // tokencleaner: an expired bootstrap token is deleted.
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap();
    Api::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let token_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "robot-token",
                     "annotations": {"kubernetes.io/service-account.name": "robot"}},
        "type": "kubernetes.io/service-account-token"}))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    secrets
        .create(&PostParams::default(), &token_secret)
        .await
        .unwrap();
    eventually("the token Secret filled", || async {
        let s = secrets.get("robot-token").await.unwrap();
        s.data
            .as_ref()
            .and_then(|d| d.get("token"))
            .filter(|t| !t.0.is_empty())
            .map(|_| ())
    })
    .await;
    let expired: Secret = serde_json::from_value(json!({
        "metadata": {"name": "bootstrap-token-rbac01", "namespace": SYSTEM},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": "rbac01", "token-secret": "0123456789abcdef",
                       "expiration": "2020-01-01T00:00:00Z"}}))
    .unwrap();
    let system_secrets: Api<Secret> = Api::namespaced(admin.clone(), SYSTEM);
    system_secrets
        .create(&PostParams::default(), &expired)
        .await
        .unwrap();
    eventually("the expired bootstrap token deleted", || async {
        system_secrets
            .get_opt("bootstrap-token-rbac01")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let slices = eventually("an EndpointSlice of web with the Pod", || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns)
            .list(&lp)
            .await
            .unwrap()
            .items;
        let found = slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .any(|e| e.addresses == [ip]);
        found.then_some(slices)
    })
    .await;
    let endpoint = &slices[0].endpoints[0];
    assert_eq!(endpoint.node_name.as_deref(), Some(node.as_str()));
    assert_eq!(
        endpoint.zone.as_deref(),
        Some("zone-a"),
        "the endpoint carries its Node's zone"
    );
    eventually("Endpoints web with the Pod", || async {
        let ep = Api::<Endpoints>::namespaced(admin.clone(), &ns)
            .get_opt("web")
            .await
            .unwrap()?;
        let ready: Vec<String> = ep
            .subsets
            .iter()
            .flatten()
            .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
            .collect();
        (ready == [ip]).then_some(())
    })
    .await;
    let pool: ipnet::IpNet = POOL.parse().unwrap();
    let address = eventually("a LoadBalancer address for lb", || async {
        let svc = services.get("lb").await.unwrap();
        lbipam::ingress_ips(&svc).first().copied()
    })
    .await;
    assert!(pool.contains(&address), "{address} from {POOL}");
    let lb = services.get("lb").await.unwrap();
    assert!(
        lb.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == lbipam::FINALIZER),
        "the finalizer was written"
    );

    // Updates and deletes too: the Pod turns unready (slices and Endpoints updated), the
    // LoadBalancer Service is deleted (its finalizer removed by lb-ipam, its slices deleted).
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status("web-0", &PatchParams::default(), &Patch::Merge(unready))
        .await
        .unwrap();
    eventually(
        "web's endpoint to turn unready in slices and Endpoints",
        || async {
            let lp = ListParams::default().labels("kubernetes.io/service-name=web");
            let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns)
                .list(&lp)
                .await
                .unwrap()
                .items;
            let unready_slice = slices.iter().flat_map(|s| s.endpoints.iter()).any(|e| {
                e.addresses == [ip] && e.conditions.as_ref().and_then(|c| c.ready) == Some(false)
            });
            let ep = Api::<Endpoints>::namespaced(admin.clone(), &ns)
                .get_opt("web")
                .await
                .unwrap()?;
            let not_ready: Vec<String> = ep
                .subsets
                .iter()
                .flatten()
                .flat_map(|s| s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()))
                .collect();
            (unready_slice && not_ready == [ip]).then_some(())
        },
    )
    .await;
    services
        .delete("lb", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("lb and its slices to be gone", || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=lb");
        let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns)
            .list(&lp)
            .await
            .unwrap()
            .items;
        let gone = services.get_opt("lb").await.unwrap().is_none() && slices.is_empty();
        gone.then_some(())
    })
    .await;
    assert!(
        cm.try_wait().unwrap().is_none(),
        "controller-manager exited early; its log:\n{}",
        shown_log()
    );

    // The workload controllers: a Deployment gets its ReplicaSet and Pods (nothing schedules
    // them here); deleting it, the garbage collector removes both.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "batch"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "batch"}},
                 "template": {"metadata": {"labels": {"app": "batch"}},
                              "spec": {"containers": [{"name": "c", "image": "registry.invalid/b:1"}]}}}}))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let rs_api: Api<ReplicaSet> = Api::namespaced(admin.clone(), &ns);
    let batch_pods = ListParams::default().labels("app=batch");
    eventually("the Deployment's ReplicaSet and its 2 Pods", || async {
        let rs = rs_api.list(&batch_pods).await.unwrap().items;
        let n = pods.list(&batch_pods).await.unwrap().items.len();
        (rs.len() == 1 && n == 2).then_some(())
    })
    .await;
    deployments
        .delete("batch", &Default::default())
        .await
        .unwrap();
    eventually(
        "the garbage collector to remove the ReplicaSet and Pods",
        || async {
            let rs = rs_api.list(&batch_pods).await.unwrap().items;
            let n = pods.list(&batch_pods).await.unwrap().items.len();
            (rs.is_empty() && n == 0).then_some(())
        },
    )
    .await;

    // The namespace controller, under deploy/workload-controllers.yaml's RBAC: a deleted
    // namespace is emptied (every kind found by discovery) and released.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "rbac-deleted"}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "rbac-deleted")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "content"}})).unwrap(),
        )
        .await
        .unwrap();
    namespaces
        .delete("rbac-deleted", &Default::default())
        .await
        .unwrap();
    eventually("the deleted namespace emptied and gone", || async {
        namespaces
            .get_opt("rbac-deleted")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // The resourcequota controller, under deploy/workload-controllers.yaml's RBAC: a quota's
    // usage is counted (Pods and Services from the shared caches, Secrets and Deployments through
    // their own metadata watches) and comes down when a counted object is deleted.
    let quota_ns = "rbac-quota";
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": quota_ns}})).unwrap(),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), quota_ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "counted"}})).unwrap(),
        )
        .await
        .unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), quota_ns);
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "q"}, "spec": {"hard": {
                "secrets": "5", "count/deployments.apps": "5", "pods": "5", "services": "5"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let quota_used = |secrets: &'static str| {
        let quotas = quotas.clone();
        move || {
            let quotas = quotas.clone();
            async move {
                let used = quotas.get("q").await.unwrap().status?.used?;
                let used: Vec<(String, String)> = used.into_iter().map(|(k, v)| (k, v.0)).collect();
                let want: Vec<(String, String)> = [
                    ("count/deployments.apps", "0"),
                    ("pods", "0"),
                    ("secrets", secrets),
                    ("services", "0"),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                (used == want).then_some(())
            }
        }
    };
    eventually("the quota's usage counted", quota_used("1")).await;
    secrets
        .delete("counted", &Default::default())
        .await
        .unwrap();
    eventually("the quota's usage replenished", quota_used("0")).await;

    // The volume controllers, under deploy/workload-controllers.yaml's RBAC: a claim is bound to
    // a volume (both updated, both statuses written, both finalizers added) and, deleted, its
    // volume of policy Delete (a host path under /tmp that does not exist) is deleted (the
    // finalizers removed, the volume deleted).
    let volume_ns = "rbac-volumes";
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": volume_ns}})).unwrap(),
        )
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let volume_name = format!("rbac-volume-{}", std::process::id());
    pvs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": volume_name}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "rbac", "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": format!("/tmp/kpr-rbac-absent-{}", std::process::id())}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), volume_ns);
    pvcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "rbac",
            "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    eventually("the claim bound", || async {
        let c = pvcs.get("data").await.unwrap();
        let bound = c.status?.phase.as_deref() == Some("Bound");
        let protected = c.metadata.finalizers.unwrap_or_default().len() == 1;
        (bound && protected).then_some(())
    })
    .await;
    pvcs.delete("data", &Default::default()).await.unwrap();
    eventually("the released volume deleted", || async {
        pvs.get_opt(&volume_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // persistentvolume-attach-detach: a Pod's CSI volume on a node the controller attaches for
    // gets its VolumeAttachment (create), the node its volumesAttached once attached
    // (nodes/status patch), and the attachment goes with the Pod (delete).
    let attach_node = format!("rbac-attach-{}", std::process::id());
    let nodes_api: Api<Node> = Api::all(admin.clone());
    nodes_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": attach_node, "annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let csi_volume = format!("rbac-csi-{}", std::process::id());
    pvs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": csi_volume}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": volume_ns, "name": "attached"},
            "csi": {"driver": "rbac.example.com", "volumeHandle": "h"}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    pvcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "attached"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let volume_pods: Api<Pod> = Api::namespaced(admin.clone(), volume_ns);
    let user: Pod = serde_json::from_value(json!({"metadata": {"name": "user"}, "spec": {
        "nodeName": attach_node,
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "attached"}}]}}))
    .unwrap();
    // The namespace's default ServiceAccount (which admission wants) comes from the controller.
    eventually("the Pod using the CSI volume created", || async {
        volume_pods
            .create(&PostParams::default(), &user)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(admin.clone());
    let attachment = eventually("the VolumeAttachment created", || async {
        vas.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|a| a.spec.node_name == attach_node)
            .and_then(|a| a.metadata.name)
    })
    .await;
    vas.patch_status(
        &attachment,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();
    eventually("the node reporting the volume attached", || async {
        let n = nodes_api.get(&attach_node).await.unwrap();
        let attached = n.status?.volumes_attached.unwrap_or_default();
        (attached.len() == 1).then_some(())
    })
    .await;
    volume_pods
        .delete("user", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the VolumeAttachment deleted", || async {
        vas.get_opt(&attachment)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    nodes_api
        .delete(&attach_node, &Default::default())
        .await
        .unwrap();

    // resourceclaim: a Pod's claim from a template is made (create) and recorded in the Pod's
    // status (server-side apply on pods/status).
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(admin.clone(), volume_ns);
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tpl"}, "spec": {"spec": {
                "devices": {"requests": [{"name": "r",
                    "exactly": {"deviceClassName": "example.com"}}]}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let dra_pod: Pod = serde_json::from_value(json!({"metadata": {"name": "dra"}, "spec": {
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]}}))
    .unwrap();
    volume_pods
        .create(&PostParams::default(), &dra_pod)
        .await
        .unwrap();
    eventually("the Pod's ResourceClaim made and recorded", || async {
        let p = volume_pods.get("dra").await.unwrap();
        let name = p
            .status?
            .resource_claim_statuses?
            .first()?
            .resource_claim_name
            .clone()?;
        Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(admin.clone(), volume_ns)
            .get_opt(&name)
            .await
            .unwrap()
            .map(|_| ())
    })
    .await;

    // clusterrole-aggregation: the bootstrap `view` role gets its rules (a patch with escalate).
    eventually("the view ClusterRole aggregated", || async {
        let view = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
            .get("view")
            .await
            .unwrap();
        view.rules.is_some_and(|r| !r.is_empty()).then_some(())
    })
    .await;
    // ttl: the Node's annotation (a patch).
    eventually("the ttl annotation on the Node", || async {
        let n = Api::<Node>::all(admin.clone()).get(&node).await.unwrap();
        n.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("node.alpha.kubernetes.io/ttl")
            .then_some(())
    })
    .await;
    // csrapproving and csrsigning: a kubelet client request made by the admin is approved (a
    // SubjectAccessReview, the approval subresource, `approve` on its signer) and signed (the
    // status subresource, `sign` on its signer).
    let csrs: Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> =
        Api::all(admin.clone());
    let request = {
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        let key = rcgen::KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    };
    let mut csr: k8s_openapi::api::certificates::v1::CertificateSigningRequest =
        serde_json::from_value(json!({"metadata": {"name": format!("{ns}-kubelet")},
            "spec": {"request": "", "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "usages": ["digital signature", "client auth"]}}))
        .unwrap();
    csr.spec.request = k8s_openapi::ByteString(request.into_bytes());
    csrs.create(&PostParams::default(), &csr).await.unwrap();
    eventually("the kubelet's request approved and signed", || async {
        let c = csrs.get(&format!("{ns}-kubelet")).await.unwrap();
        let signed = c.status?.certificate.is_some_and(|b| !b.0.is_empty());
        signed.then_some(())
    })
    .await;

    // SIGTERM: the Lease is released (an update the Role grants) and the process exits cleanly.
    let pid = cm.id().expect("controller-manager running").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(20), cm.wait())
        .await
        .expect("controller-manager to exit after SIGTERM")
        .unwrap();
    let text = shown_log();
    assert!(status.success(), "exit status {status}; log:\n{text}");
    assert_eq!(lease_holder(&admin).await, None, "the Lease was released");

    // Nothing was denied (the API server's message: `<resource> is forbidden: ...`).
    let denied: Vec<&str> = text
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
        .collect();
    assert!(
        denied.is_empty(),
        "denied requests: {denied:#?}\nlog:\n{text}"
    );
    panics.finish();
}
