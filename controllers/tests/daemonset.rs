//! The DaemonSet controller end to end against the reference control plane with kwok nodes and
//! the real kube-scheduler, once with kube-controller-manager (`upstream_*`), once with our
//! `controller-manager` (`kpr_*`), and the two runs compared (`differential_*`). One control plane
//! per flavour; the five scenarios of a flavour run concurrently, once per test binary, on the
//! first test that asks. Each scenario expects what upstream v1.34 does (the `upstream_*` tests
//! prove the expectations on the reference) and records its observables; the differential tests
//! require equal records. docs/WORKLOADS.md lists what the scenarios prove and the accepted
//! differences.
//!
//! - coverage (DS-1, DS-4, DS-5): a node selector leaves a node out; a new node gets a Pod; a
//!   relabelled node gains one and another loses one; the Pods' node affinity and tolerations;
//! - taints (DS-4): a NoSchedule taint keeps the running Pod (and counts it misscheduled), a new
//!   node tainted NoSchedule gets none, a NoExecute taint removes the Pod;
//! - rolling (DS-7): a template change rolls 4 nodes with maxUnavailable 1, never more than one
//!   node without a serving Pod (from the watch), two ControllerRevisions;
//! - surge (DS-7, v1.34's maxSurge): the same with maxSurge 1 and maxUnavailable 0: never a node
//!   without a serving Pod, never more than two Pods for one node;
//! - on-delete: a template change replaces nothing until a Pod is deleted.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;
/// This suite's own modules, in `daemonset/`.
mod daemonset {
    pub mod harness;
}

use daemonset::harness;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use harness::{Counts, Flavour, Run, State};
use kube::ResourceExt as _;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    Coverage,
    Taints,
    Rolling,
    Surge,
    OnDelete,
}

const ALL: [Scenario; 5] = [
    Scenario::Coverage,
    Scenario::Taints,
    Scenario::Rolling,
    Scenario::Surge,
    Scenario::OnDelete,
];

/// What a scenario observed (`record`, compared across flavours) and which of its expectations
/// failed (`problems`).
#[derive(Debug, Clone, Default)]
struct Outcome {
    record: BTreeMap<String, Value>,
    problems: Vec<String>,
}

impl Outcome {
    fn record(&mut self, key: &str, v: impl serde::Serialize) {
        self.record.insert(
            key.to_string(),
            serde_json::to_value(v).unwrap_or(Value::Null),
        );
    }

    fn expect(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.problems.push(what.into());
        }
    }
}

/// Waits until exactly `nodes` have a serving Pod, no other Pod exists and the DaemonSet's
/// status is current with `want`; returns the state.
async fn settle(
    run: &Run,
    ds: &str,
    nodes: &[String],
    want: Counts,
    what: &str,
) -> anyhow::Result<State> {
    run.wait_for(what, |s| {
        let settled =
            s.serving_nodes() == nodes && s.pods.len() == nodes.len() && s.counts(ds) == Some(want);
        settled.then(|| s.clone())
    })
    .await
}

fn tolerations(p: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let mut t: Vec<String> = p
        .spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .map(|t| {
            format!(
                "{}:{}:{}",
                t.key.clone().unwrap_or_default(),
                t.operator.clone().unwrap_or_default(),
                t.effect.clone().unwrap_or_default()
            )
        })
        .collect();
    t.sort();
    t
}

async fn coverage(run: &Run) -> anyhow::Result<Outcome> {
    let mut o = Outcome::default();
    let n = |i| run.node_name(i);
    for (i, role) in [(0, Some("daemon")), (1, Some("daemon")), (2, None)] {
        let labels = role.map_or(json!({}), |r| json!({"role": r}));
        run.add_node(i, labels, json!([])).await?;
    }
    run.create_daemon_set(
        "cover",
        json!({"template": {"spec": {"nodeSelector": {"role": "daemon"}}}}),
    )
    .await?;
    let s = settle(
        run,
        "cover",
        &[n(0), n(1)],
        (2, 2, 0, 2, 2, 2, 0),
        "Pods on the two selected nodes",
    )
    .await?;
    let pod = s.pods.values().next().expect("two Pods");
    let mut affinity = serde_json::to_value(pod.spec.as_ref().and_then(|s| s.affinity.clone()))?;
    // The node's name differs per Pod: the shape is what is compared.
    let target = harness::target_node(pod);
    affinity = serde_json::from_str(&affinity.to_string().replace(&target, "<node>"))?;
    o.record("pod node affinity", &affinity);
    o.record("pod tolerations", tolerations(pod));
    o.expect(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["key"]
            == "metadata.name",
        "DS-5 the Pod is pinned by a matchFields metadata.name term",
    );
    o.record("1 initial", s.serving_nodes());

    run.add_node(3, json!({"role": "daemon"}), json!([]))
        .await?;
    let s = settle(
        run,
        "cover",
        &[n(0), n(1), n(3)],
        (3, 3, 0, 3, 3, 3, 0),
        "a Pod on the new node",
    )
    .await?;
    o.record("2 after a node joined", s.serving_nodes());

    run.label_node(2, json!({"role": "daemon"})).await?;
    run.label_node(0, json!({"role": null})).await?;
    let s = settle(
        run,
        "cover",
        &[n(1), n(2), n(3)],
        (3, 3, 0, 3, 3, 3, 0),
        "the relabelled nodes: a Pod on node 2, none on node 0",
    )
    .await?;
    o.record("3 after relabelling", s.serving_nodes());
    o.record("Pods created (per node)", {
        let mut v: Vec<String> = s.pods_seen.iter().map(|(_, n)| n.clone()).collect();
        v.sort();
        v
    });
    // Events are written in the background: wait for the deletion's before recording them.
    let events = run
        .wait_for("the SuccessfulCreate and SuccessfulDelete events", |s| {
            let has = |r: &str| s.events.iter().any(|e| e == r);
            (has("SuccessfulCreate") && has("SuccessfulDelete")).then(|| s.events.clone())
        })
        .await?;
    o.record("events", {
        let mut e = events;
        e.sort();
        e
    });
    Ok(o)
}

async fn taints(run: &Run) -> anyhow::Result<Outcome> {
    let mut o = Outcome::default();
    let n = |i| run.node_name(i);
    run.add_node(0, json!({}), json!([])).await?;
    run.add_node(1, json!({}), json!([])).await?;
    run.create_daemon_set("taint", json!({})).await?;
    let s = settle(
        run,
        "taint",
        &[n(0), n(1)],
        (2, 2, 0, 2, 2, 2, 0),
        "Pods on both nodes",
    )
    .await?;
    let kept = s.pods_on(&n(0))[0].name_any();

    // v1.34 queues no sync for a NoSchedule taint on a node that keeps its Pod (its node-update
    // filter only looks for Pods to create or delete, or a non-zero misscheduled count), so the
    // status catches up at the DaemonSet's next sync: the NoExecute taint below.
    run.set_taints(
        0,
        json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
    )
    .await?;
    run.add_node(
        2,
        json!({}),
        json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
    )
    .await?;
    run.set_taints(
        1,
        json!([{"key": "dedicated", "value": "x", "effect": "NoExecute"}]),
    )
    .await?;
    let s = settle(
        run,
        "taint",
        &[n(0)],
        (0, 0, 1, 0, 0, 0, 0),
        "the NoExecute-tainted node loses its Pod, the new tainted node gets none",
    )
    .await?;
    o.record(
        "NoSchedule on node 0, NoExecute on node 1, node 2 joined tainted",
        s.serving_nodes(),
    );
    o.expect(
        s.pods_on(&n(0)).first().map(|p| p.name_any()) == Some(kept.clone()),
        format!("DS-4 the Pod {kept} on the NoSchedule-tainted node is kept"),
    );
    o.expect(
        !s.pods_seen.iter().any(|(_, node)| *node == n(2)),
        "DS-4 no Pod for a node tainted NoSchedule",
    );
    o.record("Pods created", s.pods_seen.len());
    Ok(o)
}

/// A template change rolled over 4 nodes (`strategy`: the rollingUpdate parameters); at most
/// `budget` nodes without a serving Pod at any watched state.
async fn rolling(run: &Run, strategy: Value, budget: usize) -> anyhow::Result<Outcome> {
    let mut o = Outcome::default();
    let nodes: Vec<String> = (0..4).map(|i| run.node_name(i)).collect();
    for i in 0..4 {
        run.add_node(i, json!({}), json!([])).await?;
    }
    run.create_daemon_set(
        "roll",
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": strategy}}),
    )
    .await?;
    let s = settle(
        run,
        "roll",
        &nodes,
        (4, 4, 0, 4, 4, 4, 0),
        "Pods on all four nodes",
    )
    .await?;
    let first_hash = s
        .pods
        .values()
        .next()
        .and_then(|p| p.labels().get("controller-revision-hash").cloned());
    run.track(&nodes);
    run.patch_daemon_set(
        "roll",
        json!({"template": {"metadata": {"annotations": {"rollout": "2"}}}}),
    )
    .await?;
    let s = run
        .wait_for("the rollout to finish", |s| {
            let hashes: std::collections::BTreeSet<_> = s
                .pods
                .values()
                .map(|p| p.labels().get("controller-revision-hash").cloned())
                .collect();
            let done = s.serving_nodes() == nodes
                && s.pods.len() == 4
                && hashes.len() == 1
                && !hashes.contains(&first_hash)
                && s.counts("roll") == Some((4, 4, 0, 4, 4, 4, 0));
            done.then(|| s.clone())
        })
        .await?;
    o.record("max nodes without a serving Pod", s.max_unavailable);
    o.expect(
        s.max_unavailable <= budget,
        format!(
            "DS-7 at most {budget} node(s) without a serving Pod, saw {}",
            s.max_unavailable
        ),
    );
    o.record("most Pods for one node at once", s.max_per_node);
    o.record("Pods created", s.pods_seen.len());
    o.record("Pods deleted", s.pods_deleted.len());
    o.record("revision numbers", run.revision_numbers().await?);
    Ok(o)
}

async fn on_delete(run: &Run) -> anyhow::Result<Outcome> {
    let mut o = Outcome::default();
    let n = |i| run.node_name(i);
    run.add_node(0, json!({}), json!([])).await?;
    run.add_node(1, json!({}), json!([])).await?;
    run.create_daemon_set(
        "manual",
        json!({"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}),
    )
    .await?;
    let s = settle(
        run,
        "manual",
        &[n(0), n(1)],
        (2, 2, 0, 2, 2, 2, 0),
        "Pods on both nodes",
    )
    .await?;
    let before: Vec<String> = s.pods.keys().cloned().collect();
    run.patch_daemon_set(
        "manual",
        json!({"template": {"metadata": {"annotations": {"rollout": "2"}}}}),
    )
    .await?;
    let s = settle(
        run,
        "manual",
        &[n(0), n(1)],
        (2, 2, 0, 2, 0, 2, 0),
        "the new generation observed, no Pod updated",
    )
    .await?;
    o.expect(
        s.pods.keys().cloned().collect::<Vec<_>>() == before,
        "OnDelete: no Pod replaced by the template change",
    );
    let victim = s.pods_on(&n(0))[0].name_any();
    run.delete_pod(&victim).await?;
    let s = settle(
        run,
        "manual",
        &[n(0), n(1)],
        (2, 2, 0, 2, 1, 2, 0),
        "the deleted Pod replaced from the new template",
    )
    .await?;
    o.record("Pods created", s.pods_seen.len());
    o.record("revision numbers", run.revision_numbers().await?);
    Ok(o)
}

type Results = Arc<BTreeMap<Scenario, Result<Outcome, String>>>;

async fn run_one(flavour: Flavour, scenario: Scenario) -> anyhow::Result<Outcome> {
    let tag = match scenario {
        Scenario::Coverage => "cover",
        Scenario::Taints => "taint",
        Scenario::Rolling => "roll",
        Scenario::Surge => "surge",
        Scenario::OnDelete => "ondelete",
    };
    let run = Run::new(flavour, tag).await?;
    match scenario {
        Scenario::Coverage => coverage(&run).await,
        Scenario::Taints => taints(&run).await,
        Scenario::Rolling => rolling(&run, json!({"maxUnavailable": 1}), 1).await,
        Scenario::Surge => rolling(&run, json!({"maxUnavailable": 0, "maxSurge": 1}), 0).await,
        Scenario::OnDelete => on_delete(&run).await,
    }
}

/// Every scenario's outcome under `flavour`, all run concurrently on first request.
async fn results(flavour: Flavour) -> Results {
    type Cell = Arc<tokio::sync::OnceCell<Results>>;
    static MEMO: Mutex<BTreeMap<Flavour, Cell>> = Mutex::new(BTreeMap::new());
    let cell = MEMO
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(flavour)
        .or_default()
        .clone();
    cell.get_or_init(|| async move {
        if let Err(e) = Run::shared(flavour) {
            let e = format!("{e:#}");
            return Arc::new(ALL.iter().map(|s| (*s, Err(e.clone()))).collect());
        }
        let runs = ALL.iter().map(|s| async move {
            let r = run_one(flavour, *s)
                .await
                .map_err(|e| format!("{flavour:?} {s:?}: {e:#}"));
            (*s, r)
        });
        Arc::new(futures::future::join_all(runs).await.into_iter().collect())
    })
    .await
    .clone()
}

async fn check(flavour: Flavour, scenario: Scenario) {
    let o = match &results(flavour).await[&scenario] {
        Ok(o) => o.clone(),
        Err(e) => panic!("{e}"),
    };
    if std::env::var_os("KPR_DAEMONSET_SHOW").is_some() {
        eprintln!("{flavour:?} {scenario:?}: {:#}", json!(o.record));
    }
    assert!(
        o.problems.is_empty(),
        "{flavour:?} {scenario:?} broke {} expectation(s):\n{}\nrecord: {:#?}",
        o.problems.len(),
        o.problems.join("\n"),
        o.record
    );
}

/// The two flavours' records must be equal (docs/WORKLOADS.md lists what is left out and why).
async fn differential(scenario: Scenario) {
    let (up, ours) = futures::future::join(results(Flavour::Upstream), results(Flavour::Kpr)).await;
    let (up, ours) = match (&up[&scenario], &ours[&scenario]) {
        (Ok(u), Ok(o)) => (u.record.clone(), o.record.clone()),
        (u, o) => panic!("{scenario:?} did not run on both: upstream {u:?}, kpr {o:?}"),
    };
    assert_eq!(
        ours, up,
        "{scenario:?}: kpr's record (left) differs from kube-controller-manager's (right)"
    );
}

common::scenario_tests! {
    Coverage => upstream_daemonset_coverage, kpr_daemonset_coverage, differential_daemonset_coverage;
    Taints => upstream_daemonset_taints, kpr_daemonset_taints, differential_daemonset_taints;
    Rolling => upstream_daemonset_rolling_max_unavailable, kpr_daemonset_rolling_max_unavailable, differential_daemonset_rolling_max_unavailable;
    Surge => upstream_daemonset_rolling_max_surge, kpr_daemonset_rolling_max_surge, differential_daemonset_rolling_max_surge;
    OnDelete => upstream_daemonset_on_delete, kpr_daemonset_on_delete, differential_daemonset_on_delete;
}
