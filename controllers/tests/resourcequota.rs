//! The resourcequota controller against the reference control plane (etcd and kube-apiserver
//! with its default admission plugins, ResourceQuota among them), once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), each
//! running only the resourcequota controller. No scheduler and no kubelet: Pods stay unscheduled,
//! so a deleted Pod is gone at once.
//!
//! Script, in one namespace: Pods (BestEffort, Burstable with requests and limits of CPU, memory
//! and ephemeral storage), Services (ClusterIP, NodePort), ConfigMaps, a Secret, claims (one of
//! the class `gold`, one without class), a Deployment and a ReplicationController exist before
//! any quota. Then eight quotas: Pods and ephemeral storage (unscoped), object counts
//! (`count/deployments.apps`, a `count/` of a resource the API server does not serve and an
//! extended resource no evaluator tracks among them), and the scopes BestEffort, NotBestEffort
//! (CPU and memory, bare, requests and limits), Terminating, NotTerminating, PriorityClass (a
//! selector) and CrossNamespacePodAffinity. Their first usage is the controller's full count of
//! what exists; a quota naming a non-standard resource is refused by validation; a Pod over the
//! NotBestEffort quota is refused by admission. Then more of each kind (admission charges them),
//! then deletions, a Pod turning Succeeded, a Service turning NodePort and a claim's removal: the
//! usage comes down only through the controller. Last, a quota's hard set changes (a resource
//! added, one removed). After each step every quota's `status.used` must become the table below,
//! the same for both managers (upstream's canonical quantities included).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`). Takes about 10 to 20 s, both
//! managers at once.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Cluster, Flavour};
use controlplane::Options;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};

/// kube-controller-manager's name of the controller; ours takes the same.
const CONTROLLERS: &str = "resourcequota-controller";
const NS: &str = "quota-scenario";
const WAIT: Duration = Duration::from_secs(60);

type Table = BTreeMap<&'static str, BTreeMap<String, String>>;

fn start(flavour: Flavour) -> Cluster {
    let opts = Options::minimal(controlplane::run_dir(&format!(
        "resourcequota-{}",
        flavour.tag()
    )));
    tokio::task::block_in_place(|| {
        Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), |_| Ok(()))
    })
    .expect("starting the control plane")
}

/// Creates an object of any kind from its manifest, in the test namespace unless it is
/// cluster-scoped.
async fn create(client: &Client, manifest: Value) {
    let api_version = manifest["apiVersion"].as_str().unwrap().to_string();
    let kind = manifest["kind"].as_str().unwrap().to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let plural = match kind.as_str() {
        "PriorityClass" => "priorityclasses".to_string(),
        k => format!("{}s", k.to_lowercase()),
    };
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let obj: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    let api: Api<DynamicObject> = if kind == "PriorityClass" || kind == "Namespace" {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), NS, &ar)
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {}: {e}", manifest["metadata"]["name"]));
}

fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn resources(requests: Value, limits: Value) -> Value {
    json!([{"name": "c", "image": "busybox", "resources": {"requests": requests, "limits": limits}}])
}

fn named(api_version: &str, kind: &str, name: &str, rest: Value) -> Value {
    let mut v = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let (Some(v), Some(rest)) = (v.as_object_mut(), rest.as_object()) {
        v.extend(rest.clone());
    }
    v
}

fn claim(name: &str, class: Option<&str>, size: &str) -> Value {
    let mut spec =
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}});
    if let Some(c) = class {
        spec["storageClassName"] = json!(c);
    }
    named("v1", "PersistentVolumeClaim", name, json!({"spec": spec}))
}

fn deployment(name: &str) -> Value {
    named(
        "apps/v1",
        "Deployment",
        name,
        json!({"spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
    )
}

fn quota(name: &str, spec: Value) -> Value {
    named("v1", "ResourceQuota", name, json!({"spec": spec}))
}

fn table(rows: &[(&'static str, &[(&str, &str)])]) -> Table {
    rows.iter()
        .map(|(q, used)| {
            (
                *q,
                used.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

async fn used(quotas: &Api<ResourceQuota>) -> Table {
    let mut out = Table::new();
    for q in quotas.list(&Default::default()).await.unwrap() {
        let name = q.metadata.name.clone().unwrap();
        let Some(name) = QUOTAS.iter().find(|n| **n == name) else {
            continue;
        };
        let used = q
            .status
            .and_then(|s| s.used)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        out.insert(*name, used);
    }
    out
}

const QUOTAS: [&str; 8] = [
    "compute",
    "objects",
    "best-effort",
    "not-best-effort",
    "terminating",
    "not-terminating",
    "high",
    "cross-ns",
];

async fn wait_for(cluster: &Cluster, quotas: &Api<ResourceQuota>, step: &str, want: &Table) {
    let start = Instant::now();
    loop {
        let got = used(quotas).await;
        if &got == want {
            return;
        }
        if start.elapsed() > WAIT {
            let mut diff = String::new();
            for (q, w) in want {
                let g = got.get(q).cloned().unwrap_or_default();
                if &g != w {
                    diff.push_str(&format!("  {q}: got {g:?}\n  {q}: want {w:?}\n"));
                }
            }
            panic!(
                "{:?}: {step}: the quotas' status.used did not become the expected table \
                 within {WAIT:?}:\n{diff}\n{}",
                cluster.flavour,
                cluster.manager_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn initial() -> Table {
    table(&[
        (
            "compute",
            &[
                ("count/pods", "2"),
                ("pods", "2"),
                ("requests.ephemeral-storage", "1Gi"),
                ("limits.ephemeral-storage", "2Gi"),
            ],
        ),
        (
            "objects",
            &[
                ("services", "2"),
                ("count/services", "2"),
                ("services.loadbalancers", "0"),
                ("services.nodeports", "2"),
                ("configmaps", "2"),
                ("count/configmaps", "2"),
                ("secrets", "1"),
                ("persistentvolumeclaims", "2"),
                ("count/persistentvolumeclaims", "2"),
                ("requests.storage", "1524Mi"),
                ("gold.storageclass.storage.k8s.io/requests.storage", "1Gi"),
                (
                    "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                    "1",
                ),
                ("replicationcontrollers", "1"),
                ("resourcequotas", "8"),
                ("count/deployments.apps", "1"),
            ],
        ),
        ("best-effort", &[("pods", "1")]),
        (
            "not-best-effort",
            &[
                ("pods", "1"),
                ("cpu", "100m"),
                ("requests.cpu", "100m"),
                ("memory", "128Mi"),
                ("requests.memory", "128Mi"),
                ("limits.cpu", "200m"),
                ("limits.memory", "256Mi"),
            ],
        ),
        ("terminating", &[("pods", "0"), ("requests.cpu", "0")]),
        ("not-terminating", &[("pods", "2")]),
        ("high", &[("pods", "0"), ("requests.cpu", "0")]),
        ("cross-ns", &[("pods", "0")]),
    ])
}

fn after_creates() -> Table {
    table(&[
        (
            "compute",
            &[
                ("count/pods", "7"),
                ("pods", "7"),
                ("requests.ephemeral-storage", "1Gi"),
                ("limits.ephemeral-storage", "2Gi"),
            ],
        ),
        (
            "objects",
            &[
                ("services", "4"),
                ("count/services", "4"),
                ("services.loadbalancers", "2"),
                ("services.nodeports", "3"),
                ("configmaps", "3"),
                ("count/configmaps", "3"),
                ("secrets", "2"),
                ("persistentvolumeclaims", "3"),
                ("count/persistentvolumeclaims", "3"),
                ("requests.storage", "3572Mi"),
                ("gold.storageclass.storage.k8s.io/requests.storage", "3Gi"),
                (
                    "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                    "2",
                ),
                ("replicationcontrollers", "1"),
                ("resourcequotas", "8"),
                ("count/deployments.apps", "2"),
            ],
        ),
        ("best-effort", &[("pods", "3")]),
        (
            "not-best-effort",
            &[
                ("pods", "4"),
                ("cpu", "500m"),
                ("requests.cpu", "500m"),
                ("memory", "480Mi"),
                ("requests.memory", "480Mi"),
                ("limits.cpu", "850m"),
                ("limits.memory", "864Mi"),
            ],
        ),
        ("terminating", &[("pods", "1"), ("requests.cpu", "100m")]),
        ("not-terminating", &[("pods", "6")]),
        ("high", &[("pods", "1"), ("requests.cpu", "50m")]),
        ("cross-ns", &[("pods", "1")]),
    ])
}

fn after_deletes() -> Table {
    table(&[
        (
            "compute",
            &[
                ("count/pods", "5"),
                ("pods", "4"),
                ("requests.ephemeral-storage", "0"),
                ("limits.ephemeral-storage", "0"),
            ],
        ),
        (
            "objects",
            &[
                ("services", "3"),
                ("count/services", "3"),
                ("services.loadbalancers", "2"),
                ("services.nodeports", "2"),
                ("configmaps", "2"),
                ("count/configmaps", "2"),
                ("secrets", "1"),
                ("persistentvolumeclaims", "2"),
                ("count/persistentvolumeclaims", "2"),
                ("requests.storage", "2548Mi"),
                ("gold.storageclass.storage.k8s.io/requests.storage", "2Gi"),
                (
                    "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                    "1",
                ),
                ("replicationcontrollers", "0"),
                ("resourcequotas", "8"),
                ("count/deployments.apps", "1"),
            ],
        ),
        ("best-effort", &[("pods", "2")]),
        (
            "not-best-effort",
            &[
                ("pods", "2"),
                ("cpu", "300m"),
                ("requests.cpu", "300m"),
                ("memory", "288Mi"),
                ("requests.memory", "288Mi"),
                ("limits.cpu", "550m"),
                ("limits.memory", "544Mi"),
            ],
        ),
        ("terminating", &[("pods", "0"), ("requests.cpu", "0")]),
        ("not-terminating", &[("pods", "4")]),
        ("high", &[("pods", "1"), ("requests.cpu", "50m")]),
        ("cross-ns", &[("pods", "1")]),
    ])
}

async fn scenario(flavour: Flavour) {
    let cluster = start(flavour);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    let nss: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Namespace")),
    );
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS}}))
        .unwrap(),
    )
    .await
    .unwrap();
    // No serviceaccount controller runs: the ServiceAccount admission needs `default`.
    create(&client, named("v1", "ServiceAccount", "default", json!({}))).await;
    create(
        &client,
        named(
            "scheduling.k8s.io/v1",
            "PriorityClass",
            "high",
            json!({"value": 1000}),
        ),
    )
    .await;

    // Before any quota.
    create(&client, pod("be-1", json!({}))).await;
    create(
        &client,
        pod(
            "burst-1",
            json!({"containers": resources(
                json!({"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "1Gi"}),
                json!({"cpu": "200m", "memory": "256Mi", "ephemeral-storage": "2Gi"}))}),
        ),
    )
    .await;
    create(
        &client,
        named(
            "v1",
            "Service",
            "clusterip",
            json!({"spec": {"ports": [{"port": 80}]}}),
        ),
    )
    .await;
    create(
        &client,
        named(
            "v1",
            "Service",
            "nodeport",
            json!({"spec": {"type": "NodePort", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}}),
        ),
    )
    .await;
    for cm in ["cm-1", "cm-2"] {
        create(&client, named("v1", "ConfigMap", cm, json!({}))).await;
    }
    create(&client, named("v1", "Secret", "s-1", json!({}))).await;
    create(&client, claim("gold-1", Some("gold"), "1Gi")).await;
    create(&client, claim("plain-1", None, "500Mi")).await;
    create(&client, deployment("d-1")).await;
    create(
        &client,
        named(
            "v1",
            "ReplicationController",
            "rc-1",
            json!({"spec": {"replicas": 0, "selector": {"app": "rc"}, "template": {
                "metadata": {"labels": {"app": "rc"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
        ),
    )
    .await;

    // The quotas. cpu and memory (requests, limits or bare) in a quota make the admission plugin
    // require them of every container of every Pod the quota covers (upstream's "backward
    // compatibility requirement"), so only the NotBestEffort quota names them: BestEffort Pods
    // can still be created, and the unscoped quota counts Pods and ephemeral storage.
    let compute = json!({"pods": "20", "count/pods": "20",
        "requests.ephemeral-storage": "10Gi", "limits.ephemeral-storage": "20Gi"});
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), NS);
    let create_quota = |manifest: Value| {
        let (client, quotas, cluster) = (&client, &quotas, &cluster);
        async move {
            let name = manifest["metadata"]["name"].as_str().unwrap().to_string();
            create(client, manifest).await;
            // Until its status has `hard`, admission refuses what it tracks, the next quota too.
            let start = Instant::now();
            while quotas
                .get(&name)
                .await
                .unwrap()
                .status
                .and_then(|s| s.hard)
                .is_none()
            {
                assert!(
                    start.elapsed() < WAIT,
                    "{:?}: quota {name} got no status.hard\n{}",
                    cluster.flavour,
                    cluster.manager_log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    create_quota(quota("compute", json!({"hard": compute}))).await;
    create_quota(quota(
        "objects",
        json!({"hard": {
            "services": "10", "count/services": "10", "services.loadbalancers": "5",
            "services.nodeports": "10", "configmaps": "10", "count/configmaps": "10",
            "secrets": "10", "persistentvolumeclaims": "10",
            "count/persistentvolumeclaims": "10", "requests.storage": "100Gi",
            "gold.storageclass.storage.k8s.io/requests.storage": "50Gi",
            "gold.storageclass.storage.k8s.io/persistentvolumeclaims": "5",
            "replicationcontrollers": "5", "resourcequotas": "10",
            "count/deployments.apps": "5",
            // Named by no evaluator: left out of status.used by both managers.
            "count/widgets.example.com": "3", "example.com/foo": "3"
        }}),
    ))
    .await;
    let scoped = |name: &str, scopes: &[&str], hard: Value| {
        quota(name, json!({"scopes": scopes, "hard": hard}))
    };
    create_quota(scoped(
        "best-effort",
        &["BestEffort"],
        json!({"pods": "10"}),
    ))
    .await;
    create_quota(scoped(
        "not-best-effort",
        &["NotBestEffort"],
        json!({"pods": "10", "cpu": "10", "requests.cpu": "10", "memory": "10Gi",
            "requests.memory": "10Gi", "limits.cpu": "20", "limits.memory": "20Gi"}),
    ))
    .await;
    create_quota(scoped(
        "terminating",
        &["Terminating"],
        json!({"pods": "10", "requests.cpu": "10"}),
    ))
    .await;
    create_quota(scoped(
        "not-terminating",
        &["NotTerminating"],
        json!({"pods": "10"}),
    ))
    .await;
    create_quota(quota(
        "high",
        json!({"hard": {"pods": "10", "requests.cpu": "10"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
    ))
    .await;
    create_quota(scoped(
        "cross-ns",
        &["CrossNamespacePodAffinity"],
        json!({"pods": "10"}),
    ))
    .await;

    wait_for(&cluster, &quotas, "the first count", &initial()).await;

    // A resource name that is neither standard nor domain-qualified is refused by the API
    // server's validation, naming the field, before any controller sees it.
    let bad: ResourceQuota =
        serde_json::from_value(quota("bad-name", json!({"hard": {"widgets": "1"}}))).unwrap();
    match quotas.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("spec.hard[widgets]") => {}
        other => panic!("{flavour:?}: a quota naming `widgets` was not refused: {other:?}"),
    }

    // Admission refuses a Pod over the compute quota.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let too_big: Pod = serde_json::from_value(pod(
        "too-big",
        json!({"containers": resources(json!({"cpu": "20", "memory": "1Gi"}),
            json!({"cpu": "20", "memory": "1Gi"}))}),
    ))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &too_big).await;
    match refused {
        Err(kube::Error::Api(s)) if s.message.contains("exceeded quota") => {}
        other => panic!("{flavour:?}: a Pod over the quota was not refused: {other:?}"),
    }

    // More of each kind: the admission plugin charges them as it admits them.
    create(
        &client,
        pod(
            "burst-2",
            json!({"containers": resources(json!({"cpu": "250m", "memory": "256Mi"}),
                json!({"cpu": "500m", "memory": "512Mi"}))}),
        ),
    )
    .await;
    create(
        &client,
        pod(
            "term-1",
            json!({"activeDeadlineSeconds": 600, "containers": resources(
                json!({"cpu": "100m", "memory": "64Mi"}), json!({"cpu": "100m", "memory": "64Mi"}))}),
        ),
    )
    .await;
    create(
        &client,
        pod(
            "high-1",
            json!({"priorityClassName": "high", "containers": resources(
                json!({"cpu": "50m", "memory": "32Mi"}), json!({"cpu": "50m", "memory": "32Mi"}))}),
        ),
    )
    .await;
    create(
        &client,
        pod(
            "cross-1",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "zone", "namespaceSelector": {}, "labelSelector": {"matchLabels": {"app": "x"}}}]}}}),
        ),
    )
    .await;
    create(&client, pod("done-1", json!({}))).await;
    create(
        &client,
        named(
            "v1",
            "Service",
            "lb",
            json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        ),
    )
    .await;
    create(
        &client,
        named(
            "v1",
            "Service",
            "lb-noports",
            json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                "ports": [{"port": 80}]}}),
        ),
    )
    .await;
    create(&client, named("v1", "ConfigMap", "cm-3", json!({}))).await;
    create(&client, named("v1", "Secret", "s-2", json!({}))).await;
    create(&client, claim("gold-2", Some("gold"), "2Gi")).await;
    create(&client, deployment("d-2")).await;
    wait_for(&cluster, &quotas, "after the creations", &after_creates()).await;

    // Deletions and changes: only the controller brings the usage down.
    // Background propagation: a core/v1 ReplicationController's default is to orphan, which
    // leaves it with an `orphan` finalizer only the garbage collector (not running) removes.
    let dp = DeleteParams::background();
    pods.delete("burst-1", &dp).await.unwrap();
    pods.delete("term-1", &dp).await.unwrap();
    pods.patch_status(
        "done-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    let dynamic = |gvk: GroupVersionKind, plural: &str| -> Api<DynamicObject> {
        Api::namespaced_with(
            client.clone(),
            NS,
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    };
    let core = |kind: &str, plural: &str| dynamic(GroupVersionKind::gvk("", "v1", kind), plural);
    core("Service", "services")
        .delete("nodeport", &dp)
        .await
        .unwrap();
    core("Service", "services")
        .patch(
            "clusterip",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "NodePort"}})),
        )
        .await
        .unwrap();
    core("ConfigMap", "configmaps")
        .delete("cm-1", &dp)
        .await
        .unwrap();
    core("Secret", "secrets").delete("s-1", &dp).await.unwrap();
    core("ReplicationController", "replicationcontrollers")
        .delete("rc-1", &dp)
        .await
        .unwrap();
    dynamic(
        GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    )
    .delete("d-1", &dp)
    .await
    .unwrap();
    // The claim protection finalizer holds a deleted claim (no controller removes it here).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    claims.delete("gold-1", &dp).await.unwrap();
    claims
        .patch(
            "gold-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    wait_for(&cluster, &quotas, "after the deletions", &after_deletes()).await;

    // A changed quota: status.used follows its new hard set (a resource added is counted, one
    // removed leaves used).
    quotas
        .patch(
            "objects",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"configmaps": null, "count/secrets": "10"}}})),
        )
        .await
        .unwrap();
    let mut want = after_deletes();
    let objects = want.get_mut("objects").unwrap();
    objects.remove("configmaps");
    objects.insert("count/secrets".into(), "1".into());
    wait_for(&cluster, &quotas, "after the objects quota changed", &want).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_quota_usage() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_quota_usage() {
    scenario(Flavour::Kpr).await;
}
