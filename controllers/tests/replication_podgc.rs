//! The replicationcontroller and podgc controllers against the reference control plane
//! (etcd, kube-apiserver, kube-scheduler, two kwok nodes), once with kube-controller-manager and
//! once with our `controller-manager`, each running only `replicationcontroller,podgc` with
//! `--terminated-pod-gc-threshold=3`; both runs follow one script and record what the API
//! server shows, normalised (generated names left out), and the two records must be equal.
//!
//! Script, in one namespace:
//! - podgc: a Pod bound to a Node that does not exist (held by a finalizer so what podgc did to
//!   it stays visible), an unscheduled Pod deleted while a finalizer holds it, and five terminated
//!   Pods (the newest evicted) against the threshold of 3;
//! - replicationcontroller: an RC of 3, `kubectl scale rc` to 5 and to 2, a rolling replacement
//!   by hand (a second RC with another selector scaled up while the first is scaled down, one Pod
//!   at a time), a ResourceQuota used up (its status written by the test: no resourcequota
//!   controller runs), so the API server refuses every Pod (ReplicaFailure FailedCreate), and its
//!   removal (the condition goes);
//! - podgc again: the terminated Pods collected (the evicted one and the oldest), the unscheduled
//!   one marked Failed, the orphan marked Failed with DisruptionTarget once its Node's quarantine
//!   (40 s) is over.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`). Takes about 90 s (the quarantine).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use common::cluster::lift_not_ready_taint;
use common::Flavour;
use controlplane::{ControlPlane, Options};
use k8s_openapi::api::core::v1::{Event, Pod, ReplicationController, ResourceQuota};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(150);
const CONTROLLERS: &str = "replicationcontroller,podgc";
const THRESHOLD: &str = "--terminated-pod-gc-threshold=3";
const HOLD: &str = "kpr.test/hold";

type Record = BTreeMap<String, Value>;

struct World {
    cp: std::sync::Mutex<ControlPlane>,
    client: Client,
    ns: String,
    flavour: Flavour,
}

/// The control plane of `flavour` with its controller manager, and a test namespace on it.
fn start(flavour: Flavour) -> anyhow::Result<(ControlPlane, String)> {
    let opts = Options {
        upstream_scheduler: true,
        kwok_nodes: 2,
        ..Options::minimal(controlplane::run_dir(&format!(
            "rc-podgc-{}",
            flavour.tag()
        )))
    };
    let mut cp = ControlPlane::start(opts)?;
    lift_not_ready_taint(&mut cp)?;
    match flavour {
        Flavour::Upstream => {
            cp.start_upstream_controller_manager_with(CONTROLLERS, &[THRESHOLD])?
        }
        Flavour::Kpr => {
            let program = PathBuf::from(env!("CARGO_BIN_EXE_controller-manager"));
            let args = vec![
                "--kubeconfig".to_string(),
                cp.admin_kubeconfig().display().to_string(),
                "--controllers".to_string(),
                CONTROLLERS.to_string(),
                THRESHOLD.to_string(),
            ];
            cp.spawn_in("controller-manager", &program, args, Vec::new(), None)?;
        }
    }
    let ns = cp.test_namespace("rc-podgc")?;
    Ok((cp, ns))
}

impl World {
    fn cp(&self) -> std::sync::MutexGuard<'_, ControlPlane> {
        self.cp.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn manager_log(&self) -> String {
        let name = match self.flavour {
            Flavour::Upstream => "kube-controller-manager",
            Flavour::Kpr => "controller-manager",
        };
        controlplane::process::tail(&self.cp().log(name), 30)
    }

    /// Polls `check` until it returns `Some`, at most [`WAIT`]; fails with what it last saw and
    /// the controller manager's log.
    async fn wait<T, F, Fut>(&self, what: &str, mut check: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
    {
        let deadline = Instant::now() + WAIT;
        let mut last = String::new();
        while Instant::now() < deadline {
            self.cp().check_alive()?;
            match check().await? {
                Ok(v) => return Ok(v),
                Err(seen) => last = seen,
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!(
            "[{:?}] timed out waiting for {what}; last seen: {last}\ncontroller manager:\n{}",
            self.flavour,
            self.manager_log()
        )
    }

    async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["-n", self.ns.as_str()];
        full.extend_from_slice(args);
        tokio::task::block_in_place(|| self.cp().kubectl_run(&full, None))
    }

    async fn pod(&self, body: Value) -> anyhow::Result<()> {
        let pod: Pod = serde_json::from_value(body)?;
        self.api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .context("creating a Pod")?;
        Ok(())
    }

    /// The RC's status, as (replicas, fullyLabeled, ready, available, observedGeneration,
    /// conditions as type/status/reason).
    async fn rc_status(&self, name: &str) -> anyhow::Result<Value> {
        let rc = self.api::<ReplicationController>().get(name).await?;
        let s = rc.status.unwrap_or_default();
        let conditions: Vec<Value> = s
            .conditions
            .unwrap_or_default()
            .into_iter()
            .map(|c| json!([c.type_, c.status, c.reason]))
            .collect();
        Ok(json!({
            "replicas": s.replicas,
            "fullyLabeled": s.fully_labeled_replicas.unwrap_or(0),
            "ready": s.ready_replicas.unwrap_or(0),
            "available": s.available_replicas.unwrap_or(0),
            "observedGeneration": s.observed_generation.unwrap_or(0),
            "conditions": conditions,
        }))
    }

    /// Active (not terminating) Pods controlled by RC `name`.
    async fn rc_pods(&self, name: &str) -> anyhow::Result<Vec<Pod>> {
        Ok(self
            .api::<Pod>()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.metadata.owner_references.iter().flatten().any(|r| {
                    r.controller == Some(true)
                        && r.kind == "ReplicationController"
                        && r.name == name
                })
            })
            .collect())
    }

    /// Waits until RC `name` has `n` active Pods and its status says `n` of each, then returns
    /// the status.
    async fn settled(&self, name: &str, n: i32) -> anyhow::Result<Value> {
        self.wait(&format!("RC {name} at {n} ready replicas"), || async {
            let pods = self.rc_pods(name).await?.len() as i32;
            let status = self.rc_status(name).await?;
            let ok = pods == n
                && ["replicas", "fullyLabeled", "ready", "available"]
                    .iter()
                    .all(|k| status[k] == json!(n));
            Ok(if ok {
                Ok(status)
            } else {
                Err(format!("{pods} Pods, status {status}"))
            })
        })
        .await
    }

    /// (reason, type, source component) of the Events about ReplicationControllers, each once.
    async fn rc_events(&self) -> anyhow::Result<Value> {
        let lp = ListParams::default().fields("involvedObject.kind=ReplicationController");
        let mut seen: Vec<Value> = self
            .api::<Event>()
            .list(&lp)
            .await?
            .items
            .into_iter()
            .map(|e| {
                json!([
                    e.reason,
                    e.type_,
                    e.source.and_then(|s| s.component),
                    e.involved_object.api_version
                ])
            })
            .collect();
        seen.sort_by_key(|v| v.to_string());
        seen.dedup();
        Ok(Value::Array(seen))
    }

    async fn release(&self, pod: &str) -> anyhow::Result<()> {
        let patch = json!({"metadata": {"finalizers": null}});
        match self
            .api::<Pod>()
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn rc(name: &str, replicas: i32, labels: Value) -> Value {
    let mut template_labels = labels.clone();
    template_labels["tier"] = json!("fe");
    json!({
        "apiVersion": "v1", "kind": "ReplicationController",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": labels,
                 "template": {"metadata": {"labels": template_labels},
                              "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
    })
}

/// A Pod kube-scheduler leaves alone (another scheduler's name), so it stays where it is put.
fn still_pod(name: &str, extra: Value) -> Value {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    json_patch::merge(&mut v, &extra);
    v
}

/// (phase, DisruptionTarget as status/reason/message, terminating) of a Pod held by [`HOLD`].
fn held_state(p: &Pod) -> Value {
    let status = p.status.clone().unwrap_or_default();
    let target = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .map(|c| json!([c.status, c.reason, c.message]));
    json!({
        "phase": status.phase,
        "disruptionTarget": target,
        "terminating": p.metadata.deletion_timestamp.is_some(),
    })
}

async fn script(w: &World) -> anyhow::Result<Record> {
    let mut r = Record::new();
    let pods = w.api::<Pod>();
    let rcs = w.api::<ReplicationController>();

    // podgc, set up first: the orphan's quarantine runs while the RCs are exercised.
    w.pod(still_pod(
        "orphan",
        json!({"metadata": {"finalizers": [HOLD]}, "spec": {"nodeName": "gone-node"}}),
    ))
    .await?;
    w.pod(still_pod(
        "unscheduled",
        json!({"metadata": {"finalizers": [HOLD]}}),
    ))
    .await?;
    pods.delete("unscheduled", &DeleteParams::default()).await?;
    for (name, phase, reason) in [
        ("t-1", "Succeeded", None),
        ("t-2", "Failed", None),
        ("t-3", "Succeeded", None),
        ("t-4", "Failed", None),
        ("t-5", "Failed", Some("Evicted")),
    ] {
        w.pod(still_pod(name, json!({}))).await?;
        let status = json!({"status": {"phase": phase, "reason": reason}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("making {name} {phase}"))?;
    }

    // An RC of 3: its Pods, their controller reference, its status.
    let pp = PostParams::default();
    let v1: ReplicationController = serde_json::from_value(rc("web", 3, json!({"app": "web"})))?;
    rcs.create(&pp, &v1).await?;
    r.insert("1 created".into(), w.settled("web", 3).await?);
    let refs: Vec<Value> = w
        .rc_pods("web")
        .await?
        .iter()
        .flat_map(|p| p.metadata.owner_references.clone().unwrap_or_default())
        .map(|o| {
            json!([
                o.api_version,
                o.kind,
                o.name,
                o.controller,
                o.block_owner_deletion
            ])
        })
        .collect();
    r.insert("1 owner references".into(), json!(refs));

    // kubectl scale rc, up and down.
    w.kubectl(&["scale", "rc", "web", "--replicas=5"]).await?;
    r.insert("2 scaled to 5".into(), w.settled("web", 5).await?);
    w.kubectl(&["scale", "rc", "web", "--replicas=2"]).await?;
    r.insert("3 scaled to 2".into(), w.settled("web", 2).await?);

    // A rolling replacement by hand: web-v2 (its own selector) up, web down, one at a time.
    let v2: ReplicationController =
        serde_json::from_value(rc("web-v2", 0, json!({"app": "web", "version": "v2"})))?;
    rcs.create(&pp, &v2).await?;
    for (step, (new, old)) in [(1, 1), (2, 0)].into_iter().enumerate() {
        w.kubectl(&["scale", "rc", "web-v2", &format!("--replicas={new}")])
            .await?;
        w.settled("web-v2", new).await?;
        w.kubectl(&["scale", "rc", "web", &format!("--replicas={old}")])
            .await?;
        w.settled("web", old).await?;
        let total = pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        r.insert(
            format!("4 rolling step {}", step + 1),
            json!({"web": w.rc_status("web").await?, "web-v2": w.rc_status("web-v2").await?,
                   "active app=web": total}),
        );
    }

    // A quota used up (its status written here: no resourcequota controller runs, so nothing
    // corrects it): every creation is refused, ReplicaFailure FailedCreate.
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}}))?;
    let quotas = w.api::<ResourceQuota>();
    quotas.create(&pp, &quota).await?;
    let used = json!({"status": {"hard": {"pods": "1"}, "used": {"pods": "1"}}});
    quotas
        .patch_status("pods", &PatchParams::default(), &Patch::Merge(&used))
        .await?;
    w.kubectl(&["scale", "rc", "web-v2", "--replicas=3"])
        .await?;
    let failed = w
        .wait("ReplicaFailure on web-v2", || async {
            let rc = rcs.get("web-v2").await?;
            let c = rc
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "ReplicaFailure");
            Ok(match c {
                Some(c) => Ok(json!({
                    "status": c.status,
                    "reason": c.reason,
                    "message names the quota": c.message.unwrap_or_default()
                        .contains("exceeded quota: pods"),
                })),
                None => Err("no ReplicaFailure condition".to_string()),
            })
        })
        .await?;
    r.insert("5 quota refuses Pods".into(), failed);
    w.api::<ResourceQuota>()
        .delete("pods", &DeleteParams::default())
        .await?;
    r.insert("6 quota gone".into(), w.settled("web-v2", 3).await?);
    r.insert("7 events".into(), w.rc_events().await?);

    // podgc: the terminated Pods above the threshold, evicted first then the oldest.
    let terminated = w
        .wait("2 of 5 terminated Pods collected", || async {
            let mut left: Vec<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .filter(|n| n.starts_with("t-"))
                .collect();
            left.sort();
            Ok(if left.len() == 3 {
                Ok(json!(left))
            } else {
                Err(format!("{left:?}"))
            })
        })
        .await?;
    r.insert("8 terminated left".into(), terminated);
    let unscheduled = w
        .wait("the unscheduled terminating Pod marked Failed", || async {
            let p = pods.get("unscheduled").await?;
            let s = held_state(&p);
            Ok(if s["phase"] == "Failed" {
                Ok(s)
            } else {
                Err(s.to_string())
            })
        })
        .await?;
    r.insert("9 unscheduled terminating".into(), unscheduled);
    w.release("unscheduled").await?;
    let orphan = w
        .wait("the orphan marked Failed and deleted", || async {
            let p = pods.get("orphan").await?;
            let s = held_state(&p);
            Ok(if s["terminating"] == true {
                Ok(s)
            } else {
                Err(s.to_string())
            })
        })
        .await?;
    r.insert("10 orphan".into(), orphan);
    w.release("orphan").await?;
    Ok(r)
}

/// What both runs must show, whoever runs the controllers.
fn expectations(r: &Record) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expect = |key: &str, want: Value| {
        if r.get(key) != Some(&want) {
            problems.push(format!("{key}: got {:?}, want {want}", r.get(key)));
        }
    };
    let status = |n: i32, generation: i64| {
        json!({"replicas": n, "fullyLabeled": n, "ready": n, "available": n,
               "observedGeneration": generation, "conditions": []})
    };
    expect("1 created", status(3, 1));
    expect(
        "1 owner references",
        json!(vec![
            json!([
                "v1",
                "ReplicationController",
                "web",
                true,
                true
            ]);
            3
        ]),
    );
    expect("2 scaled to 5", status(5, 2));
    expect("3 scaled to 2", status(2, 3));
    expect(
        "5 quota refuses Pods",
        json!({"status": "True", "reason": "FailedCreate", "message names the quota": true}),
    );
    expect("6 quota gone", status(3, 4));
    expect("8 terminated left", json!(["t-2", "t-3", "t-4"]));
    expect(
        "9 unscheduled terminating",
        json!({"phase": "Failed", "disruptionTarget": null, "terminating": true}),
    );
    expect(
        "10 orphan",
        json!({"phase": "Failed", "terminating": true, "disruptionTarget":
               ["True", "DeletionByPodGC", "PodGC: node no longer exists"]}),
    );
    problems
}

async fn run(flavour: Flavour) -> anyhow::Result<Record> {
    let (cp, ns) = tokio::task::block_in_place(|| start(flavour))?;
    let client = controlplane::client_from(cp.admin_kubeconfig()).await?;
    let world = World {
        cp: std::sync::Mutex::new(cp),
        client,
        ns,
        flavour,
    };
    script(&world).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicationcontroller_and_podgc_as_kube_controller_manager() {
    let (upstream, kpr) = tokio::join!(run(Flavour::Upstream), run(Flavour::Kpr));
    let upstream = upstream.expect("the reference run");
    let kpr = kpr.expect("the kpr run");
    if std::env::var_os("KPR_WORKLOADS_SHOW").is_some() {
        eprintln!("kube-controller-manager: {upstream:#?}\nkpr: {kpr:#?}");
    }
    let upstream_problems = expectations(&upstream);
    assert!(
        upstream_problems.is_empty(),
        "the script's expectations do not hold on kube-controller-manager:\n{}",
        upstream_problems.join("\n")
    );
    let problems = expectations(&kpr);
    assert!(
        problems.is_empty(),
        "kpr broke {} expectation(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    let keys: std::collections::BTreeSet<&String> = upstream.keys().chain(kpr.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| upstream.get(*k) != kpr.get(*k))
        .map(|k| {
            format!(
                "{k}:\n  kube-controller-manager: {:?}\n  kpr:                     {:?}",
                upstream.get(k),
                kpr.get(k)
            )
        })
        .collect();
    assert!(
        diffs.is_empty(),
        "kpr differs from kube-controller-manager in {} place(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
