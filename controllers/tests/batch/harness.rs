//! The batch scenarios' harness: a reference control plane per controller manager ([`Flavour`]):
//! etcd, kube-apiserver, kube-scheduler, kwok nodes and either kube-controller-manager or our
//! `controller-manager`, both with `--controllers=job,cronjob,ttl-after-finished`; one namespace
//! per scenario ([`Run`]) with a watch of its Pods, Jobs and Events ([`State`]); and the test's
//! part as the kubelet. The Pods of the scenarios are gated (kwok leaves their status alone, see
//! [`GATE`]; kwok's own stages would complete Job Pods at once and strip finalizers of deleted
//! Pods), so they never finish on their own: the test finishes them ([`Run::finish`]) with a
//! container exit code, and removes the gated Pods being deleted, as a kubelet does once their
//! containers stopped ([`Kubelet`]).
//!
//! Owns: this suite's model and control plane; the rest is `common`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use controlplane::Options;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;

use crate::common::cluster::lift_not_ready_taint;
use crate::common::{watch::Model, Kubelet, Recorder, Suite};
pub use crate::common::{Cluster, Flavour, GATE};

/// kube-controller-manager's names for the controllers under test; ours takes the same.
pub const CONTROLLERS: &str = "job,cronjob,ttl-after-finished";
/// kwok nodes per control plane.
pub const NODES: usize = 2;

/// One scenario's namespace, watched into [`State`].
pub type Run = crate::common::Run<State>;

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

impl Model for State {
    fn watch_error(&mut self, error: String) {
        self.errors.push(error);
    }
}

impl Suite for State {
    const WAIT: Duration = Duration::from_secs(90);

    /// kwok nodes without the not-ready taint, the scheduler, and the batch controllers.
    fn cluster(flavour: Flavour) -> anyhow::Result<Cluster> {
        let opts = Options {
            upstream_scheduler: true,
            kwok_nodes: NODES,
            ..Options::minimal(controlplane::run_dir(&format!("batch-{}", flavour.tag())))
        };
        Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), lift_not_ready_taint)
    }

    fn watches(client: &Client, ns: &str) -> Recorder<State> {
        let kubelet = Kubelet::new(Api::namespaced(client.clone(), ns));
        let mut rec = Recorder::new(State::default());
        rec.watch(
            Api::<Pod>::namespaced(client.clone(), ns),
            move |s, e| match e {
                Event::Apply(p) | Event::InitApply(p) => {
                    kubelet.finish_terminating(&p);
                    s.apply_pod(p);
                }
                Event::Delete(p) => drop(s.pods.remove(&p.name_any())),
                Event::Init | Event::InitDone => {}
            },
        )
        .watch(Api::<Job>::namespaced(client.clone(), ns), |s, e| match e {
            Event::Apply(j) | Event::InitApply(j) => s.apply_job(j),
            Event::Delete(j) => {
                s.jobs.remove(&j.name_any());
                s.jobs_deleted.push(j.name_any());
            }
            Event::Init | Event::InitDone => {}
        })
        .watch(Api::<CoreEvent>::namespaced(client.clone(), ns), |s, e| {
            if let Event::Apply(e) | Event::InitApply(e) = e {
                let obj = e.involved_object.name.clone().unwrap_or_default();
                let reason = e.reason.clone().unwrap_or_default();
                let list = s.events.entry(obj).or_default();
                if !list.contains(&reason) {
                    list.push(reason);
                }
            }
        });
        rec
    }

    fn describe(&self) -> String {
        State::describe(self)
    }
}

/// What only this suite's scenarios do.
impl Run {
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
