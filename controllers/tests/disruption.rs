//! The disruption controller against the reference control plane, once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), each
//! running only `disruption-controller`. No workload controller, scheduler or kubelet runs: the
//! test writes the owners (a Deployment with its ReplicaSet, a StatefulSet, a
//! ReplicationController, a bare ReplicaSet) and their Pods with ownerReferences itself, and
//! makes Pods Running and Ready (or not) through their status. Evictions go through the API
//! server's eviction subresource, which reads the status the controller wrote. Both runs must
//! see the same statuses (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed, the
//! DisruptionAllowed condition's status and reason, observedGeneration) at every step, and the
//! same Events.
//!
//! - drain-like, `maxUnavailable: 1` over a Deployment of 3 (its ReplicaSet's Pods): one eviction
//!   allowed, the next refused with 429 while the evicted Pod has no replacement, allowed again
//!   once one is Ready; the budget's spec edited (a new generation observed);
//! - `minAvailable: 60%` over a StatefulSet of 4 with `unhealthyPodEvictionPolicy: AlwaysAllow`:
//!   two Pods not Ready lower currentHealthy below desiredHealthy, a healthy Pod's eviction is
//!   refused, an unready one's is allowed (the API server's reading of the policy, which under
//!   the default IfHealthyBudget would refuse it);
//! - `minAvailable: 2` over two bare Pods and then three (the integer counts the Pods found);
//! - bad input: a selector matching Pods of a ReplicationController, a ReplicaSet and a bare Pod
//!   (scales summed, Warning UnmanagedPods naming the selector); Pods whose controller is a
//!   ConfigMap (SyncFailed: "configmaps does not implement the scale subresource", Warning
//!   CalculateExpectedPodCountFailed) or a ReplicaSet that does not exist (SyncFailed: found no
//!   controllers); a Pod matching two budgets (Warning MultiplePodDisruptionBudgets); a budget
//!   matching nothing (Normal NoPods).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`). About 17 s for both.

mod common;

use std::time::Duration;

use common::{Cluster, Flavour};
use controlplane::Options;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Pod, ReplicationController, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::{json, Value};

/// kube-controller-manager's name of the controller; ours takes it too.
const CONTROLLERS: &str = "disruption-controller";
const NS: &str = "pdb";
const WAIT: Duration = Duration::from_secs(30);

struct World {
    cluster: Cluster,
    client: Client,
    /// A client that does not retry a 429 (kube's default retries it 15 times, honouring the
    /// eviction's Retry-After: minutes per refused eviction).
    evictor: Client,
}

impl World {
    fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        &self,
    ) -> Api<K> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create<K>(&self, v: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        common::cluster::create_in(&self.client, NS, v).await
    }

    async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let poll = Duration::from_millis(100);
        self.cluster
            .eventually_showing(what, WAIT, poll, check)
            .await
    }

    /// A Pod with `labels`, controlled by `owner` ((kind, apiVersion, name, uid)), Running and
    /// Ready as `ready` says.
    async fn pod(
        &self,
        name: &str,
        labels: Value,
        owner: Option<(&str, &str, &str, &str)>,
        ready: bool,
    ) {
        let mut meta = json!({"name": name, "labels": labels});
        if let Some((kind, api_version, n, uid)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind, "name": n,
                "uid": uid, "controller": true}]);
        }
        self.create::<Pod>(json!({"metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}))
            .await;
        self.set_ready(name, ready).await;
    }

    async fn set_ready(&self, name: &str, ready: bool) {
        let status = if ready { "True" } else { "False" };
        let patch = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        self.api::<Pod>()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }

    async fn pdb(&self, name: &str, spec: Value) {
        self.create::<PodDisruptionBudget>(json!({"metadata": {"name": name}, "spec": spec}))
            .await;
    }

    /// Waits until the budget's status is `want`: `(expected, desired, current, allowed,
    /// condition status, condition reason)` for the budget's current generation.
    async fn status(
        &self,
        name: &str,
        want: (i32, i32, i32, i32, &str, &str),
    ) -> PodDisruptionBudget {
        let api = self.api::<PodDisruptionBudget>();
        self.eventually(&format!("PDB {name} at {want:?}"), || {
            let api = api.clone();
            async move {
                let pdb = api.get(name).await.map_err(|e| e.to_string())?;
                let got = summary(&pdb);
                let want = (
                    want.0,
                    want.1,
                    want.2,
                    want.3,
                    want.4.to_string(),
                    want.5.to_string(),
                );
                // A failed sync leaves observedGeneration as it was (upstream's failSafe).
                let current = want.5 == "SyncFailed"
                    || pdb.status.as_ref().and_then(|s| s.observed_generation)
                        == pdb.metadata.generation;
                if got == want && current {
                    Ok(pdb)
                } else {
                    Err(format!("{got:?} (observed generation current: {current})"))
                }
            }
        })
        .await
    }

    async fn evict(&self, pod: &str) -> Result<(), u16> {
        let pods: Api<Pod> = Api::namespaced(self.evictor.clone(), NS);
        match pods.evict(pod, &EvictParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) => Err(s.code),
            Err(e) => panic!("evicting {pod}: {e}"),
        }
    }

    /// Waits for an Event about `object` with `reason`, from the controller manager, and returns
    /// its type and message.
    async fn event(&self, object: &str, reason: &str) -> (String, String) {
        let events = self.api::<Event>();
        self.eventually(&format!("Event {reason} about {object}"), || {
            let events = events.clone();
            async move {
                let lp = ListParams::default()
                    .fields(&format!("involvedObject.name={object},reason={reason}"));
                let list = events.list(&lp).await.map_err(|e| e.to_string())?;
                list.items
                    .into_iter()
                    .find(|e| {
                        e.source.as_ref().and_then(|s| s.component.as_deref())
                            == Some("controllermanager")
                    })
                    .map(|e| (e.type_.unwrap_or_default(), e.message.unwrap_or_default()))
                    .ok_or_else(|| "none yet".to_string())
            }
        })
        .await
    }
}

fn summary(pdb: &PodDisruptionBudget) -> (i32, i32, i32, i32, String, String) {
    let s = pdb.status.clone().unwrap_or_default();
    let c = s
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionAllowed")
        .map(|c| (c.status, c.reason))
        .unwrap_or_default();
    (
        s.expected_pods,
        s.desired_healthy,
        s.current_healthy,
        s.disruptions_allowed,
        c.0,
        c.1,
    )
}

fn uid<K: Resource>(k: &K) -> String {
    k.meta().uid.clone().unwrap()
}

async fn drain(w: &World) {
    let d: Deployment = w
        .create(json!({"metadata": {"name": "web"}, "spec": {"replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .await;
    let rs: ReplicaSet = w
        .create(json!({"metadata": {"name": "web-1", "ownerReferences": [{"apiVersion": "apps/v1",
                "kind": "Deployment", "name": "web", "uid": uid(&d), "controller": true}]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .await;
    let rs_uid = uid(&rs);
    let owner = Some(("ReplicaSet", "apps/v1", "web-1", rs_uid.as_str()));
    for p in ["web-a", "web-b", "web-c"] {
        w.pod(p, json!({"app": "web"}), owner, true).await;
    }
    w.pdb(
        "web",
        json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
    )
    .await;
    // The Deployment's scale (3), not its ReplicaSet's (2: as in a rollout), is expected.
    w.status("web", (3, 2, 3, 1, "True", "SufficientPods"))
        .await;

    assert_eq!(
        w.evict("web-a").await,
        Ok(()),
        "the first eviction is allowed"
    );
    w.status("web", (3, 2, 2, 0, "False", "InsufficientPods"))
        .await;
    assert_eq!(w.evict("web-b").await, Err(429), "the second is refused");
    // The replacement is Ready: one disruption again.
    w.pod("web-d", json!({"app": "web"}), owner, true).await;
    let pdb = w
        .status("web", (3, 2, 3, 1, "True", "SufficientPods"))
        .await;
    assert!(
        pdb.status
            .unwrap()
            .disrupted_pods
            .unwrap_or_default()
            .is_empty(),
        "the evicted Pod is gone from disruptedPods"
    );
    // A new generation: maxUnavailable 2.
    w.api::<PodDisruptionBudget>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 2}})),
        )
        .await
        .unwrap();
    w.status("web", (3, 1, 3, 2, "True", "SufficientPods"))
        .await;
}

async fn percent_statefulset(w: &World) {
    let ss: StatefulSet = w
        .create(json!({"metadata": {"name": "db"}, "spec": {"replicas": 4, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .await;
    let ss_uid = uid(&ss);
    let owner = Some(("StatefulSet", "apps/v1", "db", ss_uid.as_str()));
    for i in 0..4 {
        w.pod(&format!("db-{i}"), json!({"app": "db"}), owner, true)
            .await;
    }
    w.pdb(
        "db",
        json!({"minAvailable": "60%", "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": {"app": "db"}}}),
    )
    .await;
    // 60% of 4 rounds up to 3.
    w.status("db", (4, 3, 4, 1, "True", "SufficientPods")).await;
    w.set_ready("db-2", false).await;
    w.set_ready("db-3", false).await;
    w.status("db", (4, 3, 2, 0, "False", "InsufficientPods"))
        .await;
    assert_eq!(
        w.evict("db-0").await,
        Err(429),
        "a healthy Pod is protected"
    );
    // Below desiredHealthy, IfHealthyBudget would refuse this one too; AlwaysAllow lets it go.
    assert_eq!(
        w.evict("db-3").await,
        Ok(()),
        "AlwaysAllow: the unready Pod may go"
    );
    w.status("db", (4, 3, 2, 0, "False", "InsufficientPods"))
        .await;
}

async fn integer_min_available(w: &World) {
    for p in ["solo-a", "solo-b"] {
        w.pod(p, json!({"app": "solo"}), None, true).await;
    }
    w.pdb(
        "solo",
        json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "solo"}}}),
    )
    .await;
    // The integer counts the Pods found; bare Pods are fine (no controller is looked at).
    w.status("solo", (2, 2, 2, 0, "False", "InsufficientPods"))
        .await;
    w.pod("solo-c", json!({"app": "solo"}), None, true).await;
    w.status("solo", (3, 2, 3, 1, "True", "SufficientPods"))
        .await;
}

async fn bad_input(w: &World) {
    // Pods of two controllers and a bare one under one budget.
    let rc: ReplicationController = w
        .create(json!({"metadata": {"name": "mix-rc"}, "spec": {"replicas": 2,
            "selector": {"mix": "yes", "from": "rc"},
            "template": {"metadata": {"labels": {"mix": "yes", "from": "rc"}},
                         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .await;
    let rs: ReplicaSet = w
        .create(json!({"metadata": {"name": "mix-rs"}, "spec": {"replicas": 1,
            "selector": {"matchLabels": {"mix": "yes", "from": "rs"}},
            "template": {"metadata": {"labels": {"mix": "yes", "from": "rs"}},
                         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .await;
    let (rc_uid, rs_uid) = (uid(&rc), uid(&rs));
    for p in ["mix-rc-a", "mix-rc-b"] {
        let owner = Some(("ReplicationController", "v1", "mix-rc", rc_uid.as_str()));
        w.pod(p, json!({"mix": "yes", "from": "rc"}), owner, true)
            .await;
    }
    let owner = Some(("ReplicaSet", "apps/v1", "mix-rs", rs_uid.as_str()));
    w.pod("mix-rs-a", json!({"mix": "yes", "from": "rs"}), owner, true)
        .await;
    w.pod("mix-bare", json!({"mix": "yes"}), None, true).await;
    w.pdb(
        "mix",
        json!({"maxUnavailable": 1, "selector": {"matchLabels": {"mix": "yes"}}}),
    )
    .await;
    // Scales 2 + 1 expected; the bare Pod counts as healthy all the same.
    w.status("mix", (3, 2, 4, 2, "True", "SufficientPods"))
        .await;
    let unmanaged = w.event("mix", "UnmanagedPods").await;
    assert_eq!(
        unmanaged,
        (
            "Warning".to_string(),
            "Pods selected by this PodDisruptionBudget (selector: &LabelSelector{MatchLabels:\
             map[string]string{mix: yes,},MatchExpressions:[]LabelSelectorRequirement{},}) were \
             found to be unmanaged. As a result, the status of the PDB cannot be calculated \
             correctly, which may result in undefined behavior. To account for these pods please \
             set \".spec.minAvailable\" field of the PDB to an integer value."
                .to_string()
        )
    );

    // A Pod matching two budgets: the Warning on the Pod names them.
    w.pdb(
        "mix-too",
        json!({"minAvailable": 1, "selector": {"matchLabels": {"from": "rs"}}}),
    )
    .await;
    w.status("mix-too", (1, 1, 1, 0, "False", "InsufficientPods"))
        .await;
    w.api::<Pod>()
        .patch(
            "mix-rs-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    let (kind, msg) = w.event("mix-rs-a", "MultiplePodDisruptionBudgets").await;
    assert_eq!(kind, "Warning");
    assert!(
        msg.starts_with(
            "Pod \"pdb\"/\"mix-rs-a\" matches multiple PodDisruptionBudgets.  Chose \"mix"
        ),
        "{msg}"
    );

    // A controller that is not scalable.
    let cm: ConfigMap = w
        .create(json!({"metadata": {"name": "not-scalable"}}))
        .await;
    let cm_uid = uid(&cm);
    w.pod(
        "cm-owned",
        json!({"odd": "cm"}),
        Some(("ConfigMap", "v1", "not-scalable", cm_uid.as_str())),
        true,
    )
    .await;
    w.pdb(
        "odd-cm",
        json!({"maxUnavailable": "10%", "selector": {"matchLabels": {"odd": "cm"}}}),
    )
    .await;
    let pdb = w
        .status("odd-cm", (0, 0, 0, 0, "False", "SyncFailed"))
        .await;
    let failed = condition_message(&pdb);
    assert_eq!(
        failed,
        "configmaps does not implement the scale subresource"
    );
    assert_eq!(
        w.event("odd-cm", "CalculateExpectedPodCountFailed").await,
        (
            "Warning".to_string(),
            format!("Failed to calculate the number of expected pods: {failed}")
        )
    );

    // A controller that does not exist.
    let missing = Some((
        "ReplicaSet",
        "apps/v1",
        "never-was",
        "00000000-0000-0000-0000-000000000001",
    ));
    w.pod("lost", json!({"odd": "lost"}), missing, true).await;
    w.pdb(
        "odd-lost",
        json!({"minAvailable": "50%", "selector": {"matchLabels": {"odd": "lost"}}}),
    )
    .await;
    let pdb = w
        .status("odd-lost", (0, 0, 0, 0, "False", "SyncFailed"))
        .await;
    assert_eq!(
        condition_message(&pdb),
        "found no controllers for pod \"lost\""
    );

    // Nothing selected.
    w.pdb(
        "empty",
        json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "none"}}}),
    )
    .await;
    w.status("empty", (0, 1, 0, 0, "False", "InsufficientPods"))
        .await;
    assert_eq!(
        w.event("empty", "NoPods").await,
        ("Normal".to_string(), "No matching pods found".to_string())
    );
}

fn condition_message(pdb: &PodDisruptionBudget) -> String {
    pdb.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "DisruptionAllowed")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

async fn scenario(flavour: Flavour) {
    let opts = Options::minimal(controlplane::run_dir(&format!(
        "disruption-{}",
        flavour.tag()
    )));
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), |_| Ok(()))
    })
    .expect("starting the control plane");
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.default_retry = false;
    let evictor = Client::try_from(config).unwrap();
    let w = World {
        cluster,
        client,
        evictor,
    };
    Api::<Namespace>::all(w.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .unwrap();
    // No serviceaccount controller runs: the ServiceAccount admission wants the default one.
    w.create::<ServiceAccount>(json!({"metadata": {"name": "default"}}))
        .await;
    drain(&w).await;
    percent_statefulset(&w).await;
    integer_min_available(&w).await;
    bad_input(&w).await;
    w.cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_pdb_statuses() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_pdb_statuses() {
    scenario(Flavour::Kpr).await;
}
