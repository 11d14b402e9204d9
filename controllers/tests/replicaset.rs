//! The ReplicaSet controller alone against the reference kube-apiserver, with kube-scheduler and
//! kwok nodes (Pods become Running and Ready without containers), in this process on the
//! crate's own informers. Needs the reference binaries (`cargo xtask setup --k8s`): `cargo test
//! -p controllers --features kpr-controlplane/reference --test replicaset`.

use std::collections::BTreeMap;
use std::time::Duration;

mod common;

use common::cluster::lift_not_ready_taint;
use common::events::recorded_by;

use controllers::runtime::cached_pod::CachedPod;
use controllers::runtime::informer::Informers;
use controllers::runtime::pods;
use controllers::workload::replicaset::{
    plan, Config, Controller, COMPONENT, SUCCESSFUL_CREATE, SUCCESSFUL_DELETE,
};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

async fn eventually<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn replica_set(name: &str, replicas: i32, min_ready: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "minReadySeconds": min_ready,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
    }))
    .unwrap()
}

struct Ns {
    rs: Api<ReplicaSet>,
    pods: Api<Pod>,
    events: Api<Event>,
}

impl Ns {
    /// The messages of the `reason` Events on ReplicaSet `name` from our component.
    async fn event_messages(&self, name: &str, reason: &str) -> Vec<String> {
        let uid = self.rs.get(name).await.unwrap().metadata.uid;
        let fields =
            format!("involvedObject.kind=ReplicaSet,involvedObject.name={name},reason={reason}");
        recorded_by(&self.events, &fields, COMPONENT)
            .await
            .into_iter()
            .filter(|e| e.involved_object.uid == uid)
            .filter_map(|e| e.message)
            .collect()
    }

    async fn active(&self, app: &str) -> Vec<Pod> {
        self.pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| pods::is_pod_active(&CachedPod::from(p)))
            .collect()
    }

    async fn status(&self, name: &str) -> (i32, i32, i32, i64) {
        let rs = self.rs.get(name).await.unwrap();
        let s = rs.status.unwrap_or_default();
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
            s.observed_generation.unwrap_or(0),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicaset_against_the_reference_api_server() {
    let mut opts = controlplane::Options::minimal(controlplane::run_dir("rs-api"));
    opts.upstream_scheduler = true;
    opts.kwok_nodes = 3;
    let mut cp = tokio::task::block_in_place(|| controlplane::ControlPlane::start(opts)).unwrap();
    let client = cp.client().await.unwrap();
    // New Nodes are tainted not-ready until kube-controller-manager's node lifecycle controller
    // lifts it; that controller does not run here.
    lift_not_ready_taint(&mut cp).unwrap();
    let namespace = cp.test_namespace("rs").unwrap();
    let informers = Informers::new(client.clone());
    let controller = Controller::new(client.clone(), &informers, Config::default());
    informers.start();
    let run = tokio::spawn(controller.clone().run());
    let ns = Ns {
        rs: Api::namespaced(client.clone(), &namespace),
        pods: Api::namespaced(client.clone(), &namespace),
        events: Api::namespaced(client.clone(), &namespace),
    };
    let pp = PostParams::default();

    // RS-4 scale up from nothing; status reaches ready and available.
    ns.rs.create(&pp, &replica_set("web", 5, 0)).await.unwrap();
    eventually("5 ready replicas", || async {
        ns.status("web").await == (5, 5, 5, 1)
    })
    .await;
    assert_eq!(ns.active("web").await.len(), 5, "CTL-8 no extra Pods");

    // Events as upstream's RealPodControl: a SuccessfulCreate on the ReplicaSet per Pod created.
    let created: Vec<String> = ns
        .active("web")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    eventually("a SuccessfulCreate event per Pod", || async {
        let messages = ns.event_messages("web", SUCCESSFUL_CREATE).await;
        created
            .iter()
            .all(|p| messages.contains(&format!("Created pod: {p}")))
    })
    .await;

    // RS-4 scale down.
    let scale = |n: i32| Patch::Merge(json!({"spec": {"replicas": n}}));
    ns.rs
        .patch("web", &PatchParams::default(), &scale(2))
        .await
        .unwrap();
    eventually("2 replicas", || async {
        ns.status("web").await == (2, 2, 2, 2)
    })
    .await;
    assert_eq!(ns.active("web").await.len(), 2);
    eventually("a SuccessfulDelete event per Pod deleted", || async {
        let messages = ns.event_messages("web", SUCCESSFUL_DELETE).await;
        let gone = created
            .iter()
            .filter(|p| !messages.contains(&format!("Deleted pod: {p}")));
        gone.count() == 2
    })
    .await;

    // CTL-7 an orphan that matches is adopted (and then one Pod is too many).
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    ns.pods.create(&pp, &orphan).await.unwrap();
    eventually("orphan adopted or deleted, 2 replicas", || async {
        let pods = ns.active("web").await;
        pods.len() == 2
            && pods
                .iter()
                .all(|p| plan::controller_of(p).is_some_and(|r| r.name == "web"))
    })
    .await;

    // CTL-7 a Pod whose labels no longer match is released and replaced.
    let victim = ns.active("web").await[0].name_any();
    ns.pods
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "moved"}}})),
        )
        .await
        .unwrap();
    eventually("released and replaced", || async {
        let released = ns.pods.get(&victim).await.unwrap();
        plan::controller_of(&released).is_none() && ns.active("web").await.len() == 2
    })
    .await;

    // RS-3 minReadySeconds: available lags ready, then catches up without another event.
    ns.rs.create(&pp, &replica_set("slow", 2, 3)).await.unwrap();
    eventually("ready before available", || async {
        let (r, ready, avail, _) = ns.status("slow").await;
        r == 2 && ready == 2 && avail < 2
    })
    .await;
    eventually("available after minReadySeconds", || async {
        ns.status("slow").await == (2, 2, 2, 1)
    })
    .await;

    // RS-3 a ReplicaSet being deleted is not managed: its Pods are not replaced.
    let finalizer = Patch::Merge(json!({"metadata": {"finalizers": ["kpr.io/test"]}}));
    ns.rs
        .patch("slow", &PatchParams::default(), &finalizer)
        .await
        .unwrap();
    ns.rs.delete("slow", &DeleteParams::orphan()).await.unwrap();
    let labels: BTreeMap<String, String> = [("app".to_string(), "slow".to_string())].into();
    for p in ns.active("slow").await {
        assert_eq!(p.metadata.labels.as_ref(), Some(&labels));
        ns.pods
            .delete(&p.name_any(), &DeleteParams::default())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        ns.active("slow").await.is_empty(),
        "RS-3 no replacement for a ReplicaSet being deleted"
    );
    ns.rs
        .patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();

    controller.shut_down();
    run.await.unwrap();
}
