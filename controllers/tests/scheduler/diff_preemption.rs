//! Preemption's choices and topology spread over bound Pods whose status comes after binding,
//! kube-scheduler and kpr's scheduler side by side (the `*-place` schedulers, binding allowed).
//!
//! Every row runs once per scheduler on nodes of its own (tainted and labelled for the row and
//! the scheduler, so no other part of the test sees them). The row's Pods are created bound by
//! `nodeName` (no scheduler places them) and their status (Running, Ready, `startTime`) is
//! written right after, as a kubelet writes it; a Pod of the spread row is then deleted while a
//! finalizer keeps it (terminating). A canary Pod per scheduler, unschedulable on purpose, then
//! proves that each scheduler has read all of that from its Pod watch (one watch, in order)
//! before the incoming Pods are created. Each row's outcome (the nominated node and the victims
//! that got a deletionTimestamp, or the node the incoming Pod is bound to) must be upstream's
//! own expectation under both schedulers.
//!
//! Rows: issue 37's three cases and upstream's `TestSelectBestCandidate` table (every criterion of
//! `pickOneNodeForPreemption`: PDB violations, lowest highest-victim priority, priority sum,
//! victim count, latest start of the highest-priority victims), `TestDryRunPreemption`'s
//! mixed-priority victims, and a spread row where one node lacks the topology key.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::scheduler::diff_cluster::{
    create_nodes, namespace, node_of, scheduled_condition, Impl, NodeSpec,
};

/// Node label (value: the row's tag) and taint key (value [`TAINT`]) that reserve a row's nodes
/// for that row and scheduler. One taint value for all: the probes' FitError messages list each
/// distinct taint once.
const ROW: &str = "kpr.test/preempt-row";
const TAINT: &str = "preempt";

/// The priority classes of upstream's tests (negative, low, mid, high, very high).
const CLASSES: [(&str, i32); 5] = [
    ("diff-neg", -100),
    ("diff-low", 0),
    ("diff-mid", 100),
    ("diff-high", 1000),
    ("diff-very-high", 10000),
];

/// A Pod of a row: name, node, CPU request, priority class, start time (seconds after
/// 2024-01-01T00:00:00Z), labels.
type Existing = (&'static str, &'static str, &'static str, &'static str, u32);

/// What a row does and what upstream answers.
enum Kind {
    /// A Pod of `class` requesting `cpu` preempts: (nominated node, sorted victims).
    Preempt {
        class: &'static str,
        cpu: &'static str,
        want: (&'static str, &'static [&'static str]),
        /// Pods (by name) a PodDisruptionBudget with no disruptions allowed covers.
        budget: &'static [&'static str],
    },
    /// An incoming Pod labelled foo=bar, maxSkew 1 on [`SPREAD_KEY`] (DoNotSchedule), preferring
    /// `prefers`; the Pods named in `terminating` are deleted (a finalizer keeps them); the nodes
    /// in `keyless` lack the key. `want`: the node it is bound to ("a|b": either).
    Spread {
        prefers: &'static str,
        terminating: &'static [&'static str],
        keyless: &'static [&'static str],
        want: &'static str,
    },
}

struct Row {
    id: &'static str,
    what: &'static str,
    /// (node, allocatable CPU).
    nodes: Vec<(&'static str, &'static str)>,
    pods: Vec<Existing>,
    kind: Kind,
}

const SMALL: &str = "100m";
const MEDIUM: &str = "200m";
const LARGE: &str = "300m";
const VERY_LARGE: &str = "500m";

fn three(cpu: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("node1", cpu), ("node2", cpu), ("node3", cpu)]
}

fn rows() -> Vec<Row> {
    let preempt = |class, cpu, want, budget| Kind::Preempt {
        class,
        cpu,
        want,
        budget,
    };
    vec![
        Row {
            id: "r1",
            what: "issue 37 #1: equal victims, started on other days per node: the latest",
            nodes: three("2"),
            pods: vec![
                ("a1", "node1", "1", "diff-low", 2 * 86400),
                ("a2", "node1", "1", "diff-low", 2 * 86400 + 60),
                ("b1", "node2", "1", "diff-low", 3 * 86400),
                ("b2", "node2", "1", "diff-low", 3 * 86400 + 60),
                ("c1", "node3", "1", "diff-low", 86400),
                ("c2", "node3", "1", "diff-low", 86400 + 60),
            ],
            kind: preempt("diff-high", "2", ("node2", &["b1", "b2"]), &[]),
        },
        Row {
            id: "r2",
            what: "issue 37 #2: of equal small victims the later-started one goes",
            nodes: vec![("node1", "10"), ("node2", "1")],
            pods: vec![
                ("a", "node1", "1", "diff-low", 86400),
                ("b", "node1", "1", "diff-low", 0),
                ("c", "node1", "4", "diff-mid", 0),
                ("d", "node1", "1", "diff-high", 0),
                ("e", "node2", "1", "diff-very-high", 0),
            ],
            kind: preempt("diff-high", "8", ("node1", &["a", "c"]), &[]),
        },
        Row {
            id: "r3",
            what: "fewest PDB violations before a lower victim priority",
            nodes: vec![("node1", VERY_LARGE), ("node2", VERY_LARGE)],
            pods: vec![
                ("p1", "node1", VERY_LARGE, "diff-low", 0),
                ("p2", "node2", VERY_LARGE, "diff-mid", 0),
            ],
            kind: preempt("diff-high", LARGE, ("node2", &["p2"]), &["p1"]),
        },
        Row {
            id: "r4",
            what: "upstream: the node whose highest-priority victim is lowest",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", MEDIUM, "diff-mid", 0),
                ("p1.2", "node1", LARGE, "diff-mid", 0),
                ("p2.1", "node2", MEDIUM, "diff-mid", 0),
                ("p2.2", "node2", MEDIUM, "diff-low", 0),
                ("p3.1", "node3", MEDIUM, "diff-low", 0),
                ("p3.2", "node3", MEDIUM, "diff-low", 0),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node3", &["p3.1", "p3.2"]), &[]),
        },
        Row {
            id: "r5",
            what: "upstream: highest priorities equal, the smallest priority sum",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", MEDIUM, "diff-mid", 0),
                ("p1.2", "node1", LARGE, "diff-mid", 0),
                ("p2.1", "node2", LARGE, "diff-mid", 0),
                ("p2.2", "node2", MEDIUM, "diff-low", 0),
                ("p3.1", "node3", MEDIUM, "diff-mid", 0),
                ("p3.2", "node3", MEDIUM, "diff-mid", 0),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node2", &["p2.1", "p2.2"]), &[]),
        },
        Row {
            id: "r6",
            what: "upstream: highest priority and sum equal, the fewest victims",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", SMALL, "diff-mid", 0),
                ("p1.2", "node1", SMALL, "diff-neg", 0),
                ("p1.3", "node1", SMALL, "diff-mid", 0),
                ("p1.4", "node1", SMALL, "diff-neg", 0),
                ("p2.1", "node2", LARGE, "diff-mid", 0),
                ("p2.2", "node2", MEDIUM, "diff-neg", 0),
                ("p3.1", "node3", MEDIUM, "diff-mid", 0),
                ("p3.2", "node3", SMALL, "diff-neg", 0),
                ("p3.3", "node3", SMALL, "diff-low", 0),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node2", &["p2.1", "p2.2"]), &[]),
        },
        Row {
            id: "r7",
            what: "upstream: the sum shifts every priority by 2^31",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", SMALL, "diff-mid", 0),
                ("p1.2", "node1", SMALL, "diff-neg", 0),
                ("p1.3", "node1", SMALL, "diff-neg", 0),
                ("p2.1", "node2", LARGE, "diff-mid", 0),
                ("p2.2", "node2", MEDIUM, "diff-neg", 0),
                ("p3.1", "node3", MEDIUM, "diff-mid", 0),
                ("p3.2", "node3", SMALL, "diff-neg", 0),
                ("p3.3", "node3", SMALL, "diff-low", 0),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node2", &["p2.1", "p2.2"]), &[]),
        },
        Row {
            id: "r8",
            what: "upstream: lowest highest priority, sum and count point elsewhere",
            nodes: vec![
                ("node1", VERY_LARGE),
                ("node2", VERY_LARGE),
                ("node3", VERY_LARGE),
                ("node4", VERY_LARGE),
            ],
            pods: vec![
                ("p1.1", "node1", SMALL, "diff-mid", 0),
                ("p1.2", "node1", SMALL, "diff-low", 0),
                ("p1.3", "node1", SMALL, "diff-low", 0),
                ("p2.1", "node2", LARGE, "diff-high", 0),
                ("p3.1", "node3", MEDIUM, "diff-mid", 0),
                ("p3.2", "node3", SMALL, "diff-low", 0),
                ("p3.3", "node3", SMALL, "diff-low", 0),
                ("p3.4", "node3", MEDIUM, "diff-low", 0),
                ("p4.1", "node4", MEDIUM, "diff-mid", 0),
                ("p4.2", "node4", SMALL, "diff-mid", 0),
                ("p4.3", "node4", SMALL, "diff-mid", 0),
                ("p4.4", "node4", SMALL, "diff-neg", 0),
            ],
            kind: preempt(
                "diff-very-high",
                VERY_LARGE,
                ("node1", &["p1.1", "p1.2", "p1.3"]),
                &[],
            ),
        },
        Row {
            id: "r9",
            what: "upstream: every start time different, the latest earliest start",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", MEDIUM, "diff-mid", 4),
                ("p1.2", "node1", MEDIUM, "diff-mid", 2),
                ("p2.1", "node2", MEDIUM, "diff-mid", 5),
                ("p2.2", "node2", MEDIUM, "diff-mid", 1),
                ("p3.1", "node3", MEDIUM, "diff-mid", 3),
                ("p3.2", "node3", MEDIUM, "diff-mid", 6),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node3", &["p3.1", "p3.2"]), &[]),
        },
        Row {
            id: "r10",
            what: "upstream: mixed priorities, the start of the highest-priority victims only",
            nodes: three(VERY_LARGE),
            pods: vec![
                ("p1.1", "node1", MEDIUM, "diff-low", 4),
                ("p1.2", "node1", MEDIUM, "diff-mid", 2),
                ("p2.1", "node2", MEDIUM, "diff-mid", 6),
                ("p2.2", "node2", MEDIUM, "diff-low", 1),
                ("p3.1", "node3", MEDIUM, "diff-low", 3),
                ("p3.2", "node3", MEDIUM, "diff-mid", 5),
            ],
            kind: preempt("diff-high", VERY_LARGE, ("node2", &["p2.1", "p2.2"]), &[]),
        },
        Row {
            id: "r11",
            what: "upstream dry run: mixed priorities, the later-started low Pod goes",
            nodes: vec![("node1", VERY_LARGE), ("node2", VERY_LARGE)],
            pods: vec![
                ("p1.1", "node1", SMALL, "diff-low", 5),
                ("p1.2", "node1", SMALL, "diff-low", 4),
                ("p1.3", "node1", MEDIUM, "diff-mid", 3),
                ("p1.4", "node1", SMALL, "diff-high", 2),
                ("p2", "node2", LARGE, "diff-high", 1),
            ],
            kind: preempt("diff-high", LARGE, ("node1", &["p1.1", "p1.3"]), &[]),
        },
        Row {
            id: "s1",
            what: "issue 37 #3: a terminating match is not counted",
            nodes: vec![("node-a", "4"), ("node-b", "4")],
            pods: vec![
                ("t", "node-a", SMALL, "diff-low", 0),
                ("r", "node-b", SMALL, "diff-low", 0),
            ],
            kind: Kind::Spread {
                prefers: "node-b",
                terminating: &["t"],
                keyless: &[],
                want: "node-a",
            },
        },
        Row {
            id: "s2",
            what: "a node without the topology key holds no domain and fails the Pod",
            nodes: vec![("node-a", "4"), ("node-b", "4"), ("node-c", "4")],
            pods: vec![
                ("x", "node-a", SMALL, "diff-low", 0),
                ("y", "node-b", SMALL, "diff-low", 0),
            ],
            kind: Kind::Spread {
                prefers: "node-c",
                terminating: &[],
                keyless: &["node-c"],
                want: "node-a|node-b",
            },
        },
    ]
}

/// The row's tag for one scheduler: namespace, node prefix, label and taint value.
fn tag(row: &Row, imp: Impl) -> String {
    format!("pre-{}-{}", row.id, imp.tag())
}

/// The spread rows' topology key (a node lacking it holds no domain).
const SPREAD_KEY: &str = "kpr.test/spread-host";

/// Namespaces, priority classes and the nodes of every row (before the schedulers start: the
/// probes' messages count every node, so none may appear while they run).
pub async fn setup(client: &Client) -> anyhow::Result<()> {
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in CLASSES {
        pcs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))?,
        )
        .await
        .with_context(|| format!("creating PriorityClass {name}"))?;
    }
    for row in rows() {
        for imp in Impl::BOTH {
            let t = tag(&row, imp);
            namespace(client, &t).await?;
            let keyless: &[&str] = match &row.kind {
                Kind::Spread { keyless, .. } => keyless,
                Kind::Preempt { .. } => &[],
            };
            let nodes: Vec<NodeSpec> = row
                .nodes
                .iter()
                .map(|(n, cpu)| {
                    let name = format!("{t}-{n}");
                    let mut labels = std::collections::BTreeMap::from([(ROW.into(), t.clone())]);
                    if !keyless.contains(n) {
                        labels.insert(SPREAD_KEY.into(), name.clone());
                    }
                    NodeSpec {
                        name,
                        labels,
                        taints: vec![json!({"key": ROW, "value": TAINT, "effect": "NoSchedule"})],
                        allocatable: [("cpu", *cpu), ("memory", "64Gi"), ("pods", "110")]
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        unschedulable: false,
                    }
                })
                .collect();
            create_nodes(client, &nodes).await?;
        }
    }
    Ok(())
}

fn start_time(seconds: u32) -> String {
    let t = k8s_openapi::jiff::Timestamp::from_second(1_704_067_200 + i64::from(seconds))
        .expect("a valid time");
    t.to_string()
}

/// Creates a row's bound Pods, then writes their status; deletes the terminating ones.
async fn existing(client: &Client, row: &Row, imp: Impl) -> anyhow::Result<()> {
    let t = tag(row, imp);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &t);
    let (budget, terminating): (&[&str], &[&str]) = match &row.kind {
        Kind::Preempt { budget, .. } => (budget, &[]),
        Kind::Spread { terminating, .. } => (&[], terminating),
    };
    for (name, node, cpu, class, _) in &row.pods {
        let mut labels = json!({"foo": "bar"});
        if budget.contains(name) {
            labels["budget"] = json!("yes");
        }
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": format!("{t}-{node}"), "priorityClassName": class,
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": cpu}}}]}
        });
        if terminating.contains(name) {
            pod["metadata"]["finalizers"] = json!(["kpr.test/keep"]);
        }
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await
            .with_context(|| format!("{t}: creating {name}"))?;
    }
    for (name, _, _, _, start) in &row.pods {
        let status = json!({"status": {"phase": "Running", "startTime": start_time(*start),
            "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .with_context(|| format!("{t}: writing {name}'s status"))?;
    }
    if !budget.is_empty() {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &t);
        let pdb = json!({"metadata": {"name": "budget"},
            "spec": {"minAvailable": budget.len(), "selector": {"matchLabels": {"budget": "yes"}}}});
        pdbs.create(&PostParams::default(), &serde_json::from_value(pdb)?)
            .await
            .with_context(|| format!("{t}: creating the PodDisruptionBudget"))?;
    }
    for name in terminating {
        pods.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("{t}: deleting {name}"))?;
    }
    Ok(())
}

/// One canary per `*-place` scheduler, unschedulable on purpose: once it has its PodScheduled
/// condition, that scheduler has read every earlier Pod event.
async fn canaries(client: &Client) -> anyhow::Result<()> {
    let ns = "pre-canary";
    namespace(client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for imp in Impl::BOTH {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": imp.place_name()},
            "spec": {"schedulerName": imp.place_name(), "nodeSelector": {"kpr.test/nowhere": "x"},
                     "containers": [{"name": "c", "image": "busybox"}]}});
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = pods.list(&ListParams::default()).await?;
        if list.items.iter().all(|p| scheduled_condition(p).is_some()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("a canary Pod got no PodScheduled condition");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The incoming Pod of a row.
fn incoming(row: &Row, imp: Impl) -> Value {
    let t = tag(row, imp);
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "incoming", "labels": {"foo": "bar"}},
        "spec": {"schedulerName": imp.place_name(), "nodeSelector": {ROW: t},
                 "tolerations": [{"key": ROW, "operator": "Equal", "value": TAINT, "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": "busybox"}]}
    });
    match &row.kind {
        Kind::Preempt { class, cpu, .. } => {
            pod["spec"]["priorityClassName"] = json!(class);
            pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": cpu}});
        }
        Kind::Spread { prefers, .. } => {
            pod["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": 1, "topologyKey": SPREAD_KEY, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"foo": "bar"}}}]);
            pod["spec"]["affinity"] = json!({"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                    "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname",
                        "operator": "In", "values": [format!("{t}-{prefers}")]}]}}]}});
        }
    }
    pod
}

/// The row's outcome under one scheduler, node names without the row's prefix: "node victims"
/// for preemption (victims sorted), the node for spread.
async fn outcome(client: &Client, row: &Row, imp: Impl) -> anyhow::Result<String> {
    let t = tag(row, imp);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &t);
    let strip = |n: &str| n.strip_prefix(&format!("{t}-")).unwrap_or(n).to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last: Option<String> = None;
    let mut stable = 0;
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let me = list
            .items
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("incoming"));
        let now = match &row.kind {
            Kind::Spread { .. } => me.and_then(node_of).map(strip),
            Kind::Preempt { .. } => {
                let nominated = me
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.nominated_node_name.clone())
                    .filter(|n| !n.is_empty());
                let victims: BTreeSet<String> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.metadata.deletion_timestamp.is_some()
                            && p.metadata.name.as_deref() != Some("incoming")
                    })
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                nominated
                    .filter(|_| !victims.is_empty())
                    .map(|n| format!("{} {:?}", strip(&n), victims))
            }
        };
        // Preemption's victims are deleted one by one after the nomination: the outcome is the
        // one that held for a second.
        match &now {
            Some(n) if now == last => {
                stable += 1;
                if stable >= 5 || matches!(row.kind, Kind::Spread { .. }) {
                    return Ok(n.clone());
                }
            }
            _ => stable = 0,
        }
        last = now;
        if Instant::now() > deadline {
            bail!("{t}: no outcome in 60 s (last seen: {last:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn wanted(row: &Row) -> Vec<String> {
    match &row.kind {
        Kind::Preempt { want, .. } => {
            let victims: BTreeSet<String> = want.1.iter().map(|v| v.to_string()).collect();
            vec![format!("{} {:?}", want.0, victims)]
        }
        Kind::Spread { want, .. } => want.split('|').map(str::to_string).collect(),
    }
}

/// The rows' outcomes: (row, what, kube-scheduler's, kpr's, upstream's expectation).
pub struct Report {
    pub rows: Vec<(String, String, String, String, Vec<String>)>,
}

impl Report {
    /// Rows where either scheduler differs from upstream's expectation.
    pub fn differences(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(_, _, u, k, want)| !want.contains(u) || !want.contains(k))
            .map(|(id, what, u, k, want)| {
                format!("{id} ({what}): kube-scheduler {u}, kpr {k}, upstream's table {want:?}")
            })
            .collect()
    }

    pub fn table(&self) -> String {
        let mut out = String::from("row | kube-scheduler | kpr\n");
        for (id, what, u, k, _) in &self.rows {
            out.push_str(&format!("{id} {what} | {u} | {k}\n"));
        }
        out
    }
}

/// Runs every row under both schedulers.
pub async fn run(client: &Client) -> anyhow::Result<Report> {
    let rows = rows();
    for row in &rows {
        for imp in Impl::BOTH {
            existing(client, row, imp).await?;
        }
    }
    canaries(client).await?;
    for row in &rows {
        for imp in Impl::BOTH {
            let t = tag(row, imp);
            let pods: Api<Pod> = Api::namespaced(client.clone(), &t);
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(incoming(row, imp))?,
            )
            .await
            .with_context(|| format!("{t}: creating the incoming Pod"))?;
        }
    }
    // All rows at once: a row that never settles costs its 60 s once, not once per row.
    let outcomes = futures::future::join_all(rows.iter().map(|row| async move {
        tokio::join!(
            outcome(client, row, Impl::Upstream),
            outcome(client, row, Impl::Kpr)
        )
    }))
    .await;
    let mut report = Report { rows: Vec::new() };
    for (row, (u, k)) in rows.iter().zip(outcomes) {
        report.rows.push((
            row.id.to_string(),
            row.what.to_string(),
            u.unwrap_or_else(|e| format!("error: {e:#}")),
            k.unwrap_or_else(|e| format!("error: {e:#}")),
            wanted(row),
        ));
    }
    Ok(report)
}
