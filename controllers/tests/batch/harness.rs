//! The batch scenarios' harness: a reference control plane per controller manager ([`Flavour`]):
//! etcd, kube-apiserver, kube-scheduler, kwok nodes and either kube-controller-manager or our
//! `controller-manager`, both with `--controllers=job,cronjob,ttl-after-finished`; one namespace per scenario
//! ([`Run`]) with a watch of its Pods, Jobs and Events ([`State`]); and the test's part as the
//! kubelet. The Pods of the scenarios are gated (kwok leaves their status alone, see [`GATE`]),
//! so they never finish on their own: the test finishes them ([`Run::finish`]) with a container
//! exit code, and removes the gated Pods being deleted with grace period 0, as a kubelet does
//! once their containers stopped.
//!
//! Owns: the control planes (stopped when the test binary exits) and the namespaces of its runs.
//! Every wait is bounded ([`WAIT`]) and fails with what was last seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use controlplane::Options;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;

/// How long any one awaited state may take.
pub const WAIT: Duration = Duration::from_secs(90);
/// kube-controller-manager's names for the controllers under test; ours takes the same.
pub const CONTROLLERS: &str = "job,cronjob,ttl-after-finished";
/// kwok nodes per control plane.
pub const NODES: usize = 2;
/// The Pod annotation that makes kwok leave a Pod's status alone (the control plane's kwok
/// runs with `--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom`); kwok's
/// own stages would complete Job Pods at once and strip finalizers of deleted Pods.
pub const GATE: (&str, &str) = ("kwok.x-k8s.io/status", "custom");

pub use crate::flavoured::{Cluster, Flavour};

/// This binary's control plane for `flavour`: kwok nodes without the not-ready taint, the
/// scheduler, and the batch controllers.
fn start(flavour: Flavour) -> anyhow::Result<Cluster> {
    let tag = match flavour {
        Flavour::Upstream => "batch-upstream",
        Flavour::Kpr => "batch-kpr",
    };
    let opts = Options {
        upstream_scheduler: true,
        kwok_nodes: NODES,
        ..Options::minimal(controlplane::run_dir(tag))
    };
    Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), |cp| {
        // New Nodes carry the not-ready taint until kube-controller-manager's nodelifecycle
        // controller lifts it; neither flavour runs it, so the test lifts it for both.
        cp.kubectl_run(
            &[
                "taint",
                "nodes",
                "--all",
                "node.kubernetes.io/not-ready:NoSchedule-",
            ],
            None,
        )?;
        Ok(())
    })
}

/// The control plane of `flavour` for this test binary, started on first use.
pub fn shared(flavour: Flavour) -> anyhow::Result<Arc<Cluster>> {
    Cluster::shared(flavour, start)
}

/// What the watch of one namespace has seen.
#[derive(Debug, Default, Clone)]
pub struct State {
    /// Pods as last seen (deleted ones removed).
    pub pods: BTreeMap<String, Pod>,
    /// Every Pod ever seen, in order of first sight, with the Job that controls it.
    pub pods_seen: Vec<(String, String)>,
    /// Per Job: the most Pods seen not terminal at once.
    pub max_running: BTreeMap<String, usize>,
    /// Jobs as last seen.
    pub jobs: BTreeMap<String, Job>,
    /// Every Job ever seen, in order of first sight.
    pub jobs_seen: Vec<String>,
    /// Jobs seen deleted.
    pub jobs_deleted: Vec<String>,
    /// Event reasons per involved object name, in order.
    pub events: BTreeMap<String, Vec<String>>,
    /// Watch errors.
    pub errors: Vec<String>,
}

/// The Job controlling a Pod.
pub fn job_of(p: &Pod) -> String {
    p.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.name.clone())
        .unwrap_or_default()
}

/// Pod phase.
pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Not Succeeded nor Failed (a terminating Pod still runs).
pub fn running(p: &Pod) -> bool {
    !matches!(phase(p), "Succeeded" | "Failed")
}

/// Whether the Job has a True condition of type `t`.
pub fn has_condition(j: &Job, t: &str) -> bool {
    conditions(j).iter().any(|(ty, _)| ty == t)
}

/// The conditions of a Job, in order, as (type, reason); the type of one that is not True is
/// written `Type=<status>`.
pub fn conditions(j: &Job) -> Vec<(String, String)> {
    j.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| {
            let t = if c.status == "True" {
                c.type_.clone()
            } else {
                format!("{}={}", c.type_, c.status)
            };
            (t, c.reason.clone().unwrap_or_default())
        })
        .collect()
}

impl State {
    fn apply_pod(&mut self, p: Pod) {
        let name = p.name_any();
        if !self.pods.contains_key(&name) && !self.pods_seen.iter().any(|(n, _)| *n == name) {
            self.pods_seen.push((name.clone(), job_of(&p)));
        }
        self.pods.insert(name, p);
        let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
        for p in self.pods.values().filter(|p| running(p)) {
            *per_job.entry(job_of(p)).or_default() += 1;
        }
        for (j, n) in per_job {
            let m = self.max_running.entry(j).or_default();
            *m = (*m).max(n);
        }
    }

    fn apply_job(&mut self, j: Job) {
        let name = j.name_any();
        if !self.jobs_seen.contains(&name) {
            self.jobs_seen.push(name.clone());
        }
        self.jobs.insert(name, j);
    }

    /// The Pods of Job `job` as last seen.
    pub fn pods_of(&self, job: &str) -> Vec<&Pod> {
        self.pods.values().filter(|p| job_of(p) == job).collect()
    }

    /// A summary for failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (name, j) in &self.jobs {
            let st = j.status.clone().unwrap_or_default();
            out += &format!(
                "  Job {name}: active {:?} succeeded {:?} failed {:?} conditions {:?} deleting {}\n",
                st.active,
                st.succeeded,
                st.failed,
                conditions(j),
                j.metadata.deletion_timestamp.is_some()
            );
        }
        for (name, p) in &self.pods {
            out += &format!(
                "  Pod {name} of {}: phase {} deleting {} finalizers {:?}\n",
                job_of(p),
                phase(p),
                p.metadata.deletion_timestamp.is_some(),
                p.metadata.finalizers
            );
        }
        for (obj, reasons) in &self.events {
            out += &format!("  events of {obj}: {reasons:?}\n");
        }
        if !self.errors.is_empty() {
            out += &format!("  watch errors: {:?}\n", self.errors);
        }
        out
    }
}

// One stream item; short-lived, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Change {
    Pod(Event<Pod>),
    Job(Event<Job>),
    Event(Event<CoreEvent>),
    Error(String),
}

/// One scenario's namespace with its watch.
pub struct Run {
    pub cluster: Arc<Cluster>,
    pub ns: String,
    pub client: Client,
    state: Arc<Mutex<State>>,
    changed: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Run {
    /// A fresh namespace `<tag>-<n>` on the `flavour`'s control plane, watched.
    pub async fn new(flavour: Flavour, tag: &str) -> anyhow::Result<Run> {
        let cluster = shared(flavour)?;
        let ns = tokio::task::block_in_place(|| cluster.cp().test_namespace(tag))?;
        let client = controlplane::client_from(&cluster.kubeconfig).await?;
        let state = Arc::new(Mutex::new(State::default()));
        let changed = tokio::sync::watch::channel(0u64).0;
        let task = Self::watch(client.clone(), &ns, state.clone(), changed.clone()).await?;
        Ok(Run {
            cluster,
            ns,
            client,
            state,
            changed,
            task,
        })
    }

    async fn watch(
        client: Client,
        ns: &str,
        state: Arc<Mutex<State>>,
        changed: tokio::sync::watch::Sender<u64>,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        fn stream<K>(
            api: Api<K>,
            wrap: fn(Event<K>) -> Change,
        ) -> futures::stream::BoxStream<'static, Change>
        where
            K: kube::Resource<DynamicType = ()>
                + Clone
                + std::fmt::Debug
                + serde::de::DeserializeOwned
                + Send
                + 'static,
        {
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .map_ok(wrap)
                .map(|r| r.unwrap_or_else(|e| Change::Error(e.to_string())))
                .boxed()
        }
        let mut changes = futures::stream::select_all([
            stream(Api::<Pod>::namespaced(client.clone(), ns), Change::Pod),
            stream(Api::<Job>::namespaced(client.clone(), ns), Change::Job),
            stream(
                Api::<CoreEvent>::namespaced(client.clone(), ns),
                Change::Event,
            ),
        ]);
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut synced_tx = Some(synced_tx);
            let mut inits = 0;
            let mut finishing = BTreeSet::new();
            let mut counter = 0u64;
            while let Some(change) = changes.next().await {
                let mut finish = None;
                {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    match change {
                        Change::Pod(Event::Apply(p) | Event::InitApply(p)) => {
                            if p.annotations().get(GATE.0).map(String::as_str) == Some(GATE.1)
                                && p.metadata.deletion_timestamp.is_some()
                                && finishing.insert(p.name_any())
                            {
                                finish = Some(p.name_any());
                            }
                            s.apply_pod(p);
                        }
                        Change::Pod(Event::Delete(p)) => {
                            s.pods.remove(&p.name_any());
                        }
                        Change::Job(Event::Apply(j) | Event::InitApply(j)) => s.apply_job(j),
                        Change::Job(Event::Delete(j)) => {
                            s.jobs.remove(&j.name_any());
                            s.jobs_deleted.push(j.name_any());
                        }
                        Change::Event(Event::Apply(e) | Event::InitApply(e)) => {
                            let obj = e.involved_object.name.clone().unwrap_or_default();
                            let reason = e.reason.clone().unwrap_or_default();
                            let list = s.events.entry(obj).or_default();
                            if !list.contains(&reason) {
                                list.push(reason);
                            }
                        }
                        Change::Pod(Event::InitDone)
                        | Change::Job(Event::InitDone)
                        | Change::Event(Event::InitDone) => {
                            inits += 1;
                            if inits == 3 {
                                if let Some(tx) = synced_tx.take() {
                                    let _ = tx.send(());
                                }
                            }
                        }
                        Change::Error(e) => s.errors.push(e),
                        _ => {}
                    }
                }
                counter += 1;
                changed.send_replace(counter);
                if let Some(name) = finish {
                    // The kubelet's last step for a deleted Pod whose containers stopped.
                    let pods = pods.clone();
                    tokio::spawn(async move {
                        let _ = pods
                            .delete(&name, &DeleteParams::default().grace_period(0))
                            .await;
                    });
                }
            }
        });
        tokio::time::timeout(WAIT, synced_rx)
            .await
            .context("the namespace's watches did not list in time")?
            .context("the watch task ended")?;
        Ok(task)
    }

    /// A copy of what the watch has seen.
    pub fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `check` returns `Some` (re-checked on every change, at least every 250 ms),
    /// at most [`WAIT`]; the error shows the namespace as last seen and the manager's log.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        check: impl FnMut(&State) -> Option<T>,
    ) -> anyhow::Result<T> {
        crate::flavoured::wait_for(
            &self.cluster,
            &self.ns,
            &self.state,
            &self.changed,
            WAIT,
            what,
            State::describe,
            check,
        )
        .await
    }

    /// Applies an object (YAML or JSON) with kubectl's server-side apply... through the API:
    /// creates `obj` in this namespace.
    pub async fn create<K>(&self, obj: serde_json::Value) -> anyhow::Result<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + serde::Serialize,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.ns);
        let obj: K = serde_json::from_value(obj)?;
        api.create(&Default::default(), &obj)
            .await
            .with_context(|| format!("creating {} in {}", K::kind(&()), self.ns))
    }

    /// The kubelet's report of a finished Pod: phase Succeeded (exit code 0) or Failed (any
    /// other), its one container terminated with `exit_code`.
    pub async fn finish(&self, pod: &str, exit_code: i32) -> anyhow::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let (phase, reason) = if exit_code == 0 {
            ("Succeeded", "Completed")
        } else {
            ("Failed", "Error")
        };
        let container = {
            let s = self.state();
            s.pods
                .get(pod)
                .and_then(|p| p.spec.as_ref())
                .map(|s| {
                    (
                        s.containers[0].name.clone(),
                        s.containers[0].image.clone().unwrap_or_default(),
                    )
                })
                .with_context(|| format!("Pod {pod} is not known"))?
        };
        let status = json!({"status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now,
                            "reason": "PodCompleted"}],
            "containerStatuses": [{"name": container.0, "image": container.1, "imageID": "",
                "ready": false, "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                          "startedAt": now, "finishedAt": now}}}],
        }});
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("finishing Pod {pod} with exit code {exit_code}"))?;
        Ok(())
    }

    /// Patches a CronJob's status (the test standing in for an earlier run).
    pub async fn patch_cron_job_status(
        &self,
        name: &str,
        status: serde_json::Value,
    ) -> anyhow::Result<()> {
        let api: Api<k8s_openapi::api::batch::v1::CronJob> =
            Api::namespaced(self.client.clone(), &self.ns);
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .with_context(|| format!("patching the status of CronJob {name}"))?;
        Ok(())
    }
}

/// A gated Pod template with one container (`restartPolicy` Never).
pub fn pod_template() -> serde_json::Value {
    json!({
        "metadata": {"annotations": {GATE.0: GATE.1}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10"}]}
    })
}
