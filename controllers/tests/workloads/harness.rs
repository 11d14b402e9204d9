//! The scenario harness: a fresh reference control plane per controller manager ([`Flavour`]),
//! etcd + kube-apiserver + kube-scheduler + kwok nodes + either kube-controller-manager or our
//! `controller-manager` running the replicaset, deployment and garbagecollector controllers; one
//! namespace per scenario run ([`Run`]) with the watches of `world` on it; the waits on a
//! Deployment's state; and the test's part as the kubelet of gated Pods (when they become Ready).
//!
//! Owns: this suite's control plane and its waits; the rest is `common`'s. Never sleeps to assert: [`Run::settled`] waits for a quiet period only to decide when
//! to make gated Pods Ready, and every check waits for a state with a deadline.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::Options;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;

use super::world::{self, is_gated, is_ready, spec_replicas, State};
use crate::common::cluster::lift_not_ready_taint;
use crate::common::run::run_command;
pub use crate::common::{Cluster, Flavour};
use crate::common::{Recorder, Suite, GATE};

/// How long any one awaited state may take.
pub const WAIT: Duration = Duration::from_secs(90);
/// How long nothing may change before a Deployment counts as settled (see [`Run::settled`]).
/// Controllers react to a watch event in milliseconds; a second of silence with a consistent
/// state means they are all waiting for a gated Pod to become Ready.
const SETTLE: Duration = Duration::from_secs(1);
/// kwok nodes per control plane (`kwok-node-0` ..).
pub const NODES: usize = 4;
/// kube-controller-manager's names for the controllers under test; ours takes the same.
pub const CONTROLLERS: &str = "replicaset,deployment,garbagecollector";

/// One scenario's namespace, watched into [`State`].
pub type Run = crate::common::Run<State>;

/// Starts a control plane for `flavour` in `<target>/controlplane/<exe>-<tag>.pid<pid>`.
pub fn start_cluster(flavour: Flavour, tag: &str) -> anyhow::Result<Cluster> {
    let opts = Options {
        upstream_scheduler: true,
        kwok_nodes: NODES,
        ..Options::minimal(controlplane::run_dir(tag))
    };
    Cluster::start(flavour, CONTROLLERS, opts, Vec::new(), lift_not_ready_taint)
}

impl Suite for State {
    const WAIT: Duration = WAIT;

    fn cluster(flavour: Flavour) -> anyhow::Result<Cluster> {
        start_cluster(flavour, flavour.tag())
    }

    fn watches(client: &Client, ns: &str) -> Recorder<State> {
        world::watches(client, ns)
    }

    fn describe(&self) -> String {
        self.deployments
            .keys()
            .map(|d| State::describe(self, d))
            .collect()
    }
}

/// What only this suite's scenarios do.
impl Run {
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Runs kubectl to change Deployment `d`'s spec and waits until the watch shows the new
    /// generation, so that no later wait can mistake the old state for a settled new one.
    pub async fn change_deployment(&self, d: &str, args: &[&str]) -> anyhow::Result<()> {
        let generation = |s: &State| {
            s.deployments
                .get(d)
                .and_then(|dep| dep.metadata.generation)
                .unwrap_or(0)
        };
        let before = generation(&self.lock());
        self.kubectl(args).await?;
        self.wait_on(
            &format!("the change `kubectl {}` to show", args.join(" ")),
            d,
            |s, _| (generation(s) > before).then_some(()),
        )
        .await
    }

    /// `kubectl rollout status deployment/<d>` in the background: it must succeed.
    pub fn rollout_status(&self, d: &str) -> tokio::task::JoinHandle<anyhow::Result<String>> {
        let mut cmd = self.cluster.kubectl_cmd();
        cmd.arg("-n").arg(&self.ns).args([
            "rollout",
            "status",
            &format!("deployment/{d}"),
            &format!("--timeout={}s", WAIT.as_secs()),
        ]);
        tokio::spawn(run_command(cmd, None, WAIT))
    }

    /// Waits until `check` returns `Some` on the recorded state at the current time (re-checked
    /// on every change and every 250 ms, as availability changes with time alone), at most
    /// [`WAIT`]. The error shows Deployment `d` as last seen and the controller manager's log.
    pub async fn wait_on<T>(
        &self,
        what: &str,
        d: &str,
        mut check: impl FnMut(&State, Timestamp) -> Option<T>,
    ) -> anyhow::Result<T> {
        self.wait_for_with(what, |s| s.describe(d), |s| check(s, Timestamp::now()))
            .await
    }

    /// Waits until Deployment `d` is [`consistent`] and nothing changed for [`SETTLE`]: every
    /// controller has acted on the current state and waits for a gated Pod to become Ready.
    pub async fn settled(&self, d: &str) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            self.wait_on(&format!("Deployment {d} to settle"), d, |s, now| {
                consistent(s, d, now).then_some(())
            })
            .await?;
            let events = self.lock().events;
            tokio::time::sleep(SETTLE).await;
            {
                let s = self.lock();
                if s.events == events && consistent(&s, d, Timestamp::now()) {
                    return Ok(());
                }
                if start.elapsed() > WAIT {
                    bail!(
                        "[{:?}] Deployment {d} kept changing for {WAIT:?}:\n{}",
                        self.cluster.flavour,
                        s.describe(d)
                    );
                }
            }
        }
    }

    /// Makes every bound, active, not yet Ready gated Pod of `d` Ready, all with the same
    /// lastTransitionTime (this second), as a kubelet would report them; returns how many. With
    /// minReadySeconds > 0 they become available together, whatever order the ReplicaSet
    /// controller sees the updates in.
    pub async fn release_wave(&self, d: &str) -> anyhow::Result<usize> {
        let names: Vec<String> = {
            let s = self.lock();
            s.active_pods_of(d)
                .into_iter()
                .filter(|p| is_gated(p) && bound(p) && !is_ready(p))
                .map(|p| p.name_any())
                .collect()
        };
        let now = Timestamp::from_second(Timestamp::now().as_second())?;
        let pods = self.pods();
        let patches = names.iter().map(|name| {
            let pods = pods.clone();
            async move {
                pods.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(ready_status(now)),
                )
                .await
                .with_context(|| format!("making Pod {name} Ready"))
            }
        });
        for r in futures::future::join_all(patches).await {
            r?;
        }
        Ok(names.len())
    }

    /// Drives a rollout of gated Pods to completion: settle, make the waiting Pods Ready,
    /// repeat. Returns the number of waves.
    pub async fn roll_out_in_waves(&self, d: &str) -> anyhow::Result<usize> {
        let mut waves = 0;
        loop {
            self.settled(d).await?;
            if rollout_complete(&self.lock(), d) {
                return Ok(waves);
            }
            if self.release_wave(d).await? == 0 {
                bail!(
                    "[{:?}] the rollout of {d} is stuck: settled, incomplete, and no Pod is waiting to become Ready:\n{}{}",
                    self.cluster.flavour,
                    self.lock().describe(d),
                    self.cluster.manager_log()
                );
            }
            waves += 1;
        }
    }

    /// Waits until Deployment `d` is complete as `kubectl rollout status` decides.
    pub async fn wait_complete(&self, d: &str) -> anyhow::Result<()> {
        self.wait_on(&format!("Deployment {d} to complete"), d, |s, _| {
            rollout_complete(s, d).then_some(())
        })
        .await
    }

    /// Binds Pod `name` to `node`, as a scheduler does.
    pub async fn bind(&self, name: &str, node: &str) -> anyhow::Result<()> {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        self.pods()
            .create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            )
            .await
            .with_context(|| format!("binding Pod {name} to {node}"))?;
        Ok(())
    }

    /// Creates a Deployment from `kubectl create deployment <args> --dry-run=client -o json`,
    /// changed by `edit` first (what kubectl cannot say on its command line).
    pub async fn create_deployment(
        &self,
        args: &[&str],
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> anyhow::Result<()> {
        let mut all = vec!["create", "deployment"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--dry-run=client", "-o", "json"]);
        let mut manifest: serde_json::Value = serde_json::from_str(&self.kubectl(&all).await?)?;
        edit(&mut manifest);
        self.kubectl_with(&["create", "-f", "-"], Some(manifest.to_string()))
            .await?;
        Ok(())
    }
}

/// A gated Deployment: its Pods' template carries [`GATE`], so the test decides when
/// they become Ready; `minReadySeconds` makes a wave of them available at once.
pub fn gate(manifest: &mut serde_json::Value, min_ready_seconds: i64) {
    manifest["spec"]["minReadySeconds"] = json!(min_ready_seconds);
    manifest["spec"]["template"]["metadata"]["annotations"] = json!({ (GATE.0): GATE.1 });
}

fn bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// A kubelet's status for a Pod whose containers run and pass readiness since `since`.
fn ready_status(since: Timestamp) -> serde_json::Value {
    let t = since.to_string();
    json!({"status": {
        "phase": "Running",
        "startTime": t,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": t},
            {"type": "Ready", "status": "True", "lastTransitionTime": t},
        ],
    }})
}

fn min_ready_seconds(d: &Deployment) -> i64 {
    d.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
        .into()
}

/// `kubectl rollout status`'s success: the controller observed the latest generation, every
/// replica is updated and available, and no old replica is left.
pub fn rollout_complete(s: &State, d: &str) -> bool {
    let Some(dep) = s.deployments.get(d) else {
        return false;
    };
    let Some(st) = dep.status.as_ref() else {
        return false;
    };
    let want = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let updated = st.updated_replicas.unwrap_or(0);
    st.observed_generation >= dep.metadata.generation
        && updated >= want
        && st.replicas.unwrap_or(0) <= updated
        && st.available_replicas.unwrap_or(0) >= updated
}

/// Every controller has caught up with the current state of Deployment `d`: the Deployment and
/// each ReplicaSet observed their generation; each ReplicaSet has exactly spec.replicas active,
/// bound Pods and its status counts them (ready and available as of `now`); no Pod is
/// terminating; every Pod kwok runs (not gated) and every Ready Pod is available; the
/// Deployment's status sums its ReplicaSets'.
pub fn consistent(s: &State, d: &str, now: Timestamp) -> bool {
    let Some(dep) = s.deployments.get(d) else {
        return false;
    };
    let Some(dst) = dep.status.as_ref() else {
        return false;
    };
    if dst.observed_generation != dep.metadata.generation {
        return false;
    }
    let min_ready = min_ready_seconds(dep);
    let mut sums = (0, 0, 0);
    for rs in s.replicasets_of(d) {
        let st = rs.status.clone().unwrap_or_default();
        if st.observed_generation != rs.metadata.generation || st.replicas != spec_replicas(rs) {
            return false;
        }
        let pods = s.active_pods_of_rs(&rs.name_any());
        let ready = pods.iter().filter(|p| is_ready(p)).count() as i32;
        let available = pods
            .iter()
            .filter(|p| world::is_available(p, min_ready, now))
            .count() as i32;
        if pods.len() as i32 != st.replicas
            || !pods.iter().all(|p| bound(p))
            || st.ready_replicas.unwrap_or(0) != ready
            || st.available_replicas.unwrap_or(0) != available
            || pods.iter().any(|p| {
                // kwok's Pods become Ready by themselves; any Ready Pod becomes available by
                // itself once minReadySeconds passed: a pending change, not a settled state.
                (!is_gated(p) || is_ready(p)) && !world::is_available(p, min_ready, now)
            })
        {
            return false;
        }
        sums.0 += st.replicas;
        sums.1 += st.ready_replicas.unwrap_or(0);
        sums.2 += st.available_replicas.unwrap_or(0);
    }
    let terminating = s
        .pods_named_after(d)
        .iter()
        .any(|p| p.metadata.deletion_timestamp.is_some());
    !terminating
        && dst.replicas.unwrap_or(0) == sums.0
        && dst.ready_replicas.unwrap_or(0) == sums.1
        && dst.available_replicas.unwrap_or(0) == sums.2
}

/// Names of the active Pods of Deployment `d`.
pub fn active_names(s: &State, d: &str) -> std::collections::BTreeSet<String> {
    s.active_pods_of(d).iter().map(|p| p.name_any()).collect()
}
