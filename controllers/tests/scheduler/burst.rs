//! A burst of Pods created at once (as a benchmark or a scaled-up workload does): every bound Pod
//! gets its "Scheduled" Event from `default-scheduler`, within a bounded wait after the last bind.
//! The Events are written off the scheduling path, so this is where a recorder that cannot keep
//! up with the scheduler's rate shows (it would lose what is still queued when the scheduler
//! stops).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::cases::{node, pod, CASE_LABEL};

const NS: &str = "event-burst";
const PODS: usize = 300;
const NODES: usize = 4;
/// Pod creations in flight at once.
const CREATORS: usize = 16;
/// How long the Pods may take to be bound.
const BIND_WAIT: Duration = Duration::from_secs(60);
/// How long the last Events may lag behind the last bind. A recorder writing one Event at a time
/// lagged 4.4 s here (300 Events at ~20 a second, the API server's latency under the burst); writing
/// objects' Events concurrently, they were all there at the first look (0.3 s).
const EVENT_WAIT: Duration = Duration::from_secs(3);

/// What the burst measured.
#[derive(Debug)]
pub struct Burst {
    /// From the first creation until every Pod was seen bound.
    pub bound_after: Duration,
    /// From then until every Scheduled Event was seen.
    pub events_after: Duration,
}

fn bound(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Creates [`PODS`] Pods on [`NODES`] fitting nodes, waits for all of them to be bound, then for
/// one Scheduled Event each; fails with the counts seen.
pub async fn run(client: &Client) -> anyhow::Result<Burst> {
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
    )
    .await
    .context("creating the namespace")?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
    )
    .await
    .context("creating the default ServiceAccount")?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..NODES {
        let name = format!("{NS}-{i}");
        let n: Node = serde_json::from_value(node(NS, &name, "64", json!({}), json!([])))?;
        nodes
            .create(&PostParams::default(), &n)
            .await
            .with_context(|| format!("creating node {name}"))?;
        // The API server's not-ready taint on new nodes (no node lifecycle controller here).
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": []}})),
            )
            .await
            .with_context(|| format!("clearing node {name}'s taints"))?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let start = Instant::now();
    futures::stream::iter(0..PODS)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let mut p = pod(&format!("p{i}"), "10m", json!({}), json!({}));
                p["spec"]["nodeSelector"] = json!({ CASE_LABEL: NS });
                let p: Pod = serde_json::from_value(p)?;
                pods.create(&PostParams::default(), &p)
                    .await
                    .with_context(|| format!("creating pod p{i}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATORS)
        .try_collect::<()>()
        .await?;
    let bind_deadline = start + BIND_WAIT;
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let n = list.items.iter().filter(|p| bound(p)).count();
        if n == PODS {
            break;
        }
        if Instant::now() > bind_deadline {
            bail!("after {BIND_WAIT:?} only {n} of {PODS} pods bound");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bound_after = start.elapsed();
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let selector = ListParams::default().fields("reason=Scheduled,source=default-scheduler");
    let seen = Instant::now();
    loop {
        let list = events.list(&selector).await?;
        let named: BTreeSet<&str> = list
            .items
            .iter()
            .filter_map(|e| e.involved_object.name.as_deref())
            .collect();
        if named.len() == PODS {
            return Ok(Burst {
                bound_after,
                events_after: seen.elapsed(),
            });
        }
        if seen.elapsed() > EVENT_WAIT {
            bail!(
                "{} of {PODS} Scheduled events {EVENT_WAIT:?} after the last of the pods was \
                 bound ({bound_after:?} after the first creation)",
                named.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
