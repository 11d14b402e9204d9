//! Runs [`Case`](super::cases::Case)s against a control plane whose scheduler is ours (or,
//! for a differential run, kube-scheduler): creates each case's namespace, nodes and Pods stage by
//! stage and waits, bounded, for every expectation, failing with what it saw.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::cases::{Case, Check, Expect, CASE_LABEL, HIGH_PRIORITY};

/// How long one expectation may take (scheduling is immediate; the bound covers a loaded CI
/// machine and the backoff of a Pod retried after a node appeared).
const WAIT: Duration = Duration::from_secs(60);

/// Which scheduler the control plane runs (Upstream: for a differential run of the same cases
/// against kube-scheduler; this binary runs only Kpr).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    Kpr,
    Upstream,
}

/// A control plane with kwok (one node of its own, which no case Pod may use) and a scheduler.
pub struct Cluster {
    pub cp: ControlPlane,
    pub client: Client,
}

impl Cluster {
    pub async fn start(tag: &str, scheduler: Scheduler) -> anyhow::Result<Cluster> {
        let opts = Options {
            upstream_scheduler: scheduler == Scheduler::Upstream,
            scheduler_program: (scheduler == Scheduler::Kpr)
                .then(|| env!("CARGO_BIN_EXE_scheduler").into()),
            kwok_nodes: 1,
            ..Options::minimal(controlplane::run_dir(tag))
        };
        let cp = tokio::task::block_in_place(|| ControlPlane::start(opts))?;
        let client = cp.client().await?;
        let pcs: Api<PriorityClass> = Api::all(client.clone());
        pcs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": HIGH_PRIORITY}, "value": 1000
            }))?,
        )
        .await
        .context("creating the PriorityClass")?;
        Ok(Cluster { cp, client })
    }
}

/// Where each Pod of a case ended up (node name, or "" for not bound / deleted).
pub type Placements = BTreeMap<String, String>;

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn unschedulable_condition(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .map(|c| c.message.clone().unwrap_or_default())
}

/// Runs one case; Ok(placements) when every expectation held.
pub async fn run_case(client: &Client, case: &Case) -> anyhow::Result<Placements> {
    let ns = case.name;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
    )
    .await
    .with_context(|| format!("creating namespace {ns}"))?;
    // No controller manager runs to create it; Pod admission needs it.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
    )
    .await
    .with_context(|| format!("{ns}: creating the default ServiceAccount"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    for (i, stage) in case.stages.iter().enumerate() {
        for n in &stage.nodes {
            let node: Node = serde_json::from_value(n.clone())?;
            let name = node.metadata.name.clone().unwrap_or_default();
            nodes
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("{ns}: creating node {name}"))?;
            // The API server adds the not-ready taint to new nodes (TaintNodesByCondition) and
            // no node lifecycle controller runs here to lift it: set the case's taints.
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": n["spec"]["taints"]}})),
                )
                .await
                .with_context(|| format!("{ns}: setting node {name}'s taints"))?;
        }
        for p in &stage.pods {
            let mut p: Value = p.clone();
            p["spec"]["nodeSelector"] = json!({ CASE_LABEL: ns });
            let pod: Pod = serde_json::from_value(p)?;
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("{ns}: creating pod {:?}", pod.metadata.name))?;
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let list = pods.list(&ListParams::default()).await?;
            let by_name: BTreeMap<String, &Pod> = list
                .items
                .iter()
                .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                .collect();
            let evs = events.list(&ListParams::default()).await?;
            let mut waiting = Vec::new();
            for (name, want) in &stage.expect {
                let pod = by_name.get(*name);
                let ok = match want {
                    Expect::On(allowed) => match pod.and_then(|p| node_of(p)) {
                        Some(n) if allowed.contains(&n) => true,
                        Some(n) => bail!(
                            "{ns} stage {i}: pod {name} bound to {n}, allowed only {allowed:?}"
                        ),
                        None => false,
                    },
                    Expect::Unschedulable(text) => {
                        if let Some(n) = pod.and_then(|p| node_of(p)) {
                            bail!(
                                "{ns} stage {i}: pod {name} bound to {n}, expected unschedulable"
                            );
                        }
                        let cond = pod.and_then(|p| unschedulable_condition(p));
                        let event = evs.items.iter().any(|e| {
                            e.involved_object.name.as_deref() == Some(name)
                                && e.reason.as_deref() == Some("FailedScheduling")
                                && e.message.as_deref().is_some_and(|m| m.contains(text))
                        });
                        cond.is_some_and(|m| m.starts_with("0/") && m.contains(text)) && event
                    }
                    Expect::Deleted => pod.is_none(),
                };
                if !ok {
                    waiting.push(format!(
                        "{name} (want {want:?}; node {:?}, PodScheduled=False message {:?})",
                        pod.and_then(|p| node_of(p)),
                        pod.and_then(|p| unschedulable_condition(p))
                    ));
                }
            }
            if waiting.is_empty() {
                for check in &stage.checks {
                    match check {
                        Check::Distinct(names) => {
                            let mut seen = BTreeMap::new();
                            for n in names {
                                let node = by_name.get(*n).and_then(|p| node_of(p)).unwrap_or("");
                                if let Some(other) = seen.insert(node.to_string(), n) {
                                    bail!("{ns} stage {i}: pods {other} and {n} share node {node}");
                                }
                            }
                        }
                    }
                }
                // Every bound Pod of the stage got its Scheduled Event.
                let missing: Vec<&str> = stage
                    .expect
                    .iter()
                    .filter(|(_, w)| matches!(w, Expect::On(_)))
                    .map(|(n, _)| *n)
                    .filter(|n| {
                        !evs.items.iter().any(|e| {
                            e.involved_object.name.as_deref() == Some(n)
                                && e.reason.as_deref() == Some("Scheduled")
                                && e.message.as_deref().is_some_and(|m| {
                                    m.starts_with(&format!("Successfully assigned {ns}/{n} to "))
                                })
                        })
                    })
                    .collect();
                if missing.is_empty() {
                    break;
                }
                waiting.push(format!("Scheduled events of {missing:?}"));
            }
            if Instant::now() > deadline {
                bail!(
                    "{ns} stage {i}: after {WAIT:?} still waiting for: {}",
                    waiting.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let list = pods.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                node_of(p).unwrap_or_default().to_string(),
            )
        })
        .collect())
}
