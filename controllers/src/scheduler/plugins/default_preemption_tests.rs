//! Table tests for DefaultPreemption: candidate selection, victim selection with reprieves and
//! PDBs, eligibility and the diagnosis message, after upstream v1.34's
//! `defaultpreemption/default_preemption_test.go` and `preemption/preemption_test.go`.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{json, Value};

use super::*;
use crate::scheduler::framework::{FilterPlugin, PreFilterPlugin, StaticObjects};
use crate::scheduler::plugin_args::{decode, valid, DefaultPreemptionArgs};
use crate::scheduler::plugins::inter_pod_affinity::InterPodAffinity;

/// A stand-in for NodeResourcesFit: CPU only.
struct CpuFit;

impl Plugin for CpuFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }
}

impl FilterPlugin for CpuFit {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let want = PodInfo::new(Arc::new(pod.clone())).requests.milli_cpu;
        if node.requested.milli_cpu + want > node.allocatable.milli_cpu {
            Status::unschedulable("Insufficient cpu")
        } else {
            Status::success()
        }
    }
}

/// The profile's PreFilter extensions and Filter plugins, as the runtime would run them.
#[derive(Default)]
struct Runner {
    pre: Vec<Arc<dyn PreFilterPlugin>>,
    filters: Vec<Arc<dyn FilterPlugin>>,
}

impl FilterRunner for Runner {
    fn run_filters(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        for f in &self.filters {
            let st = f.filter(state, pod, node);
            if !st.is_success() {
                return st;
            }
        }
        Status::success()
    }
    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        for p in &self.pre {
            let st = p.remove_pod(state, pod, removed, node);
            if !st.is_success() {
                return st;
            }
        }
        Status::success()
    }
    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        for p in &self.pre {
            let st = p.add_pod(state, pod, added, node);
            if !st.is_success() {
                return st;
            }
        }
        Status::success()
    }
}

fn cpu_runner() -> Runner {
    Runner {
        pre: vec![],
        filters: vec![Arc::new(CpuFit)],
    }
}

fn node(name: &str, cpu: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": cpu, "pods": "110"}}
    }))
    .unwrap()
}

/// A Pod requesting `cpu`, with `priority`, on `node` (empty: the incoming Pod), plus `extra`.
fn pod(name: &str, node: &str, cpu: &str, priority: i32, extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
        }
    });
    if !node.is_empty() {
        p["spec"]["nodeName"] = json!(node);
    }
    json_patch::merge(&mut p, &extra);
    serde_json::from_value(p).unwrap()
}

fn started(t: &str) -> Value {
    json!({"status": {"startTime": t}})
}

fn snapshot(nodes: Vec<Node>, pods: Vec<Pod>) -> Snapshot {
    let mut infos: Vec<NodeInfo> = nodes
        .into_iter()
        .map(|n| NodeInfo::new(Arc::new(n)))
        .collect();
    for p in pods {
        let target = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        let n = infos.iter_mut().find(|n| n.name() == target).unwrap();
        n.add_pod(PodInfo::new(Arc::new(p)));
    }
    Snapshot::new(infos, HashMap::new())
}

fn pdb(name: &str, selector: Value, allowed: i32) -> Arc<PodDisruptionBudget> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        }))
        .unwrap(),
    )
}

fn plugin(pdbs: Vec<Arc<PodDisruptionBudget>>, args: Option<Value>) -> DefaultPreemption {
    let objects = StaticObjects {
        pod_disruption_budgets: pdbs,
        ..Default::default()
    };
    DefaultPreemption::new(valid(args.as_ref()), Arc::new(objects)).with_offset(|_| 0)
}

/// Every node Unschedulable ("Insufficient cpu"), as after a failed Filter.
fn all_unschedulable(snap: &Snapshot) -> HashMap<String, Status> {
    snap.nodes
        .iter()
        .map(|n| {
            (
                n.name().to_string(),
                Status::unschedulable("Insufficient cpu"),
            )
        })
        .collect()
}

/// (nominated node, victim names) or the status.
fn run(
    pl: &DefaultPreemption,
    runner: &Runner,
    pod: &Pod,
    snap: &Snapshot,
    filtered: &HashMap<String, Status>,
    state: &CycleState,
) -> Result<(String, Vec<String>), (Option<PostFilterResult>, Status)> {
    let (result, status) = pl.post_filter(state, pod, snap, filtered, runner);
    match (&result, status.is_success()) {
        (Some(r), true) => Ok((
            r.nominated_node.clone(),
            r.victims
                .iter()
                .map(|v| v.metadata.name.clone().unwrap())
                .collect(),
        )),
        _ => Err((result, status)),
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn candidates_are_ordered_as_pick_one_node_for_preemption() {
    type Case<'a> = (
        &'a str,
        Vec<Node>,
        Vec<Pod>,
        Pod,
        Vec<Arc<PodDisruptionBudget>>,
        (&'a str, Vec<&'a str>),
    );
    let cases: Vec<Case> = vec![
        (
            "the node whose highest-priority victim has the lowest priority",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod("p1", "node1", "2", 10, json!({})),
                pod("p2", "node2", "2", 5, json!({})),
            ],
            pod("p", "", "1", 20, json!({})),
            vec![],
            ("node2", vec!["p2"]),
        ),
        (
            "fewest PDB violations beat a lower victim priority",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod(
                    "p1",
                    "node1",
                    "2",
                    5,
                    json!({"metadata": {"labels": {"app": "a"}}}),
                ),
                pod("p2", "node2", "2", 10, json!({})),
            ],
            pod("p", "", "1", 20, json!({})),
            vec![pdb("pdb-a", json!({"matchLabels": {"app": "a"}}), 0)],
            ("node2", vec!["p2"]),
        ),
        (
            "a PDB with disruptions left is not violated",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod(
                    "p1",
                    "node1",
                    "2",
                    5,
                    json!({"metadata": {"labels": {"app": "a"}}}),
                ),
                pod("p2", "node2", "2", 10, json!({})),
            ],
            pod("p", "", "1", 20, json!({})),
            vec![pdb("pdb-a", json!({"matchLabels": {"app": "a"}}), 1)],
            ("node1", vec!["p1"]),
        ),
        (
            "same highest priority: the smallest priority sum",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod("a1", "node1", "1", 5, json!({})),
                pod("a2", "node1", "1", 5, json!({})),
                pod("b1", "node2", "1", 5, json!({})),
                pod("b2", "node2", "1", 1, json!({})),
            ],
            pod("p", "", "2", 20, json!({})),
            vec![],
            ("node2", vec!["b1", "b2"]),
        ),
        (
            "same priorities: fewer victims (a smaller shifted priority sum)",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod("a1", "node1", "1", 5, json!({})),
                pod("a2", "node1", "1", 5, json!({})),
                pod("b1", "node2", "2", 5, json!({})),
            ],
            pod("p", "", "2", 20, json!({})),
            vec![],
            ("node2", vec!["b1"]),
        ),
        (
            "all equal but start time: the latest-started highest-priority victims",
            vec![node("node1", "2"), node("node2", "2"), node("node3", "2")],
            vec![
                pod("a", "node1", "2", 5, started("2024-01-01T00:00:00Z")),
                pod("b", "node2", "2", 5, started("2024-06-01T00:00:00Z")),
                pod("c", "node3", "2", 5, started("2024-03-01T00:00:00Z")),
            ],
            pod("p", "", "1", 20, json!({})),
            vec![],
            ("node2", vec!["b"]),
        ),
        (
            "a complete tie goes to the first candidate found",
            vec![node("node1", "2"), node("node2", "2")],
            vec![
                pod("a", "node1", "2", 5, started("2024-01-01T00:00:00Z")),
                pod("b", "node2", "2", 5, started("2024-01-01T00:00:00Z")),
            ],
            pod("p", "", "1", 20, json!({})),
            vec![],
            ("node1", vec!["a"]),
        ),
    ];
    for (name, nodes, pods, incoming, pdbs, (want_node, want_victims)) in cases {
        let snap = snapshot(nodes, pods);
        let pl = plugin(pdbs, None);
        let got = run(
            &pl,
            &cpu_runner(),
            &incoming,
            &snap,
            &all_unschedulable(&snap),
            &CycleState::new(),
        );
        assert_eq!(
            got.map_err(|e| e.1),
            Ok((want_node.to_string(), names(&want_victims))),
            "{name}"
        );
    }
}

#[test]
fn victims_are_reprieved_by_pdb_then_priority() {
    type Case<'a> = (
        &'a str,
        Vec<Pod>,
        Vec<Arc<PodDisruptionBudget>>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "higher priority Pods are reprieved first; only lower-priority Pods are candidates",
            vec![
                pod("high", "node1", "1", 10, json!({})),
                pod("low", "node1", "1", 5, json!({})),
                pod("lowest", "node1", "1", 1, json!({})),
                pod("above", "node1", "0", 30, json!({})),
            ],
            vec![],
            vec!["low", "lowest"],
        ),
        (
            "without PDBs the higher-priority Pod stays",
            vec![
                pod("a", "node1", "1", 5, json!({"metadata": {"labels": {"app": "x"}}})),
                pod("b", "node1", "1", 10, json!({})),
                pod("c", "node1", "1", 1, json!({})),
            ],
            vec![],
            vec!["a", "c"],
        ),
        (
            "a PDB-violating Pod is reprieved before a higher-priority one",
            vec![
                pod("a", "node1", "1", 5, json!({"metadata": {"labels": {"app": "x"}}})),
                pod("b", "node1", "1", 10, json!({})),
                pod("c", "node1", "1", 1, json!({})),
            ],
            vec![pdb("pdb-x", json!({"matchLabels": {"app": "x"}}), 0)],
            vec!["b", "c"],
        ),
        (
            "a Pod already in disruptedPods does not count against its PDB",
            vec![
                pod("a", "node1", "1", 5, json!({"metadata": {"labels": {"app": "x"}}})),
                pod("b", "node1", "1", 10, json!({})),
                pod("c", "node1", "1", 1, json!({})),
            ],
            vec![Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": "pdb-x", "namespace": "default"},
                    "spec": {"selector": {"matchLabels": {"app": "x"}}},
                    "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1,
                               "disruptedPods": {"a": "2024-01-01T00:00:00Z"}}
                }))
                .unwrap(),
            )],
            vec!["a", "c"],
        ),
        (
            "an empty PDB selector matches nothing",
            vec![
                pod("a", "node1", "1", 5, json!({"metadata": {"labels": {"app": "x"}}})),
                pod("b", "node1", "1", 10, json!({})),
                pod("c", "node1", "1", 1, json!({})),
            ],
            vec![pdb("pdb-all", json!({}), 0)],
            vec!["a", "c"],
        ),
    ];
    for (name, pods, pdbs, want) in cases {
        let snap = snapshot(vec![node("node1", "3")], pods);
        let pl = plugin(pdbs, None);
        let incoming = pod("p", "", "2", 20, json!({}));
        let got = run(
            &pl,
            &cpu_runner(),
            &incoming,
            &snap,
            &all_unschedulable(&snap),
            &CycleState::new(),
        );
        assert_eq!(
            got.map_err(|e| e.1),
            Ok(("node1".to_string(), names(&want))),
            "{name}"
        );
    }
}

#[test]
fn eligibility_and_diagnosis() {
    let state = CycleState::new();
    let nodes = || vec![node("node1", "2"), node("node2", "2")];

    // preemptionPolicy Never.
    let snap = snapshot(nodes(), vec![pod("v", "node1", "2", 1, json!({}))]);
    let never = pod(
        "p",
        "",
        "1",
        20,
        json!({"spec": {"preemptionPolicy": "Never"}}),
    );
    let (result, st) = plugin(vec![], None).post_filter(
        &state,
        &never,
        &snap,
        &all_unschedulable(&snap),
        &cpu_runner(),
    );
    assert_eq!(result, None);
    assert_eq!(st.code, Code::Unschedulable);
    assert_eq!(
        st.reasons,
        vec!["preemption: not eligible due to preemptionPolicy=Never."]
    );

    // A lower-priority Pod terminating by preemption on the nominated node: wait for it.
    let terminating = pod(
        "t",
        "node1",
        "2",
        1,
        json!({
            "metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}
        }),
    );
    let snap = snapshot(
        nodes(),
        vec![terminating, pod("v", "node2", "2", 1, json!({}))],
    );
    let nominated = pod(
        "p",
        "",
        "1",
        20,
        json!({"status": {"nominatedNodeName": "node1"}}),
    );
    let (result, st) = plugin(vec![], None).post_filter(
        &state,
        &nominated,
        &snap,
        &all_unschedulable(&snap),
        &cpu_runner(),
    );
    assert_eq!(result, None);
    assert_eq!(
        st.reasons,
        vec!["preemption: not eligible due to a terminating pod on the nominated node."]
    );

    // ...unless the nominated node is now unresolvable: preempt elsewhere.
    let mut filtered = all_unschedulable(&snap);
    filtered.insert(
        "node1".into(),
        Status::unresolvable("node(s) didn't match Pod's node affinity/selector"),
    );
    let got = run(
        &plugin(vec![], None),
        &cpu_runner(),
        &nominated,
        &snap,
        &filtered,
        &state,
    );
    assert_eq!(
        got.map_err(|e| e.1),
        Ok(("node2".to_string(), names(&["v"])))
    );

    // Unresolvable nodes are not candidates; a node without lower-priority Pods is no help.
    let snap = snapshot(
        nodes(),
        vec![
            pod("v", "node1", "2", 1, json!({})),
            pod("w", "node2", "2", 50, json!({})),
        ],
    );
    let mut filtered = all_unschedulable(&snap);
    filtered.insert(
        "node1".into(),
        Status::unresolvable("node(s) had untolerated taint {k: v}"),
    );
    let incoming = pod("p", "", "1", 20, json!({}));
    let (result, st) =
        plugin(vec![], None).post_filter(&state, &incoming, &snap, &filtered, &cpu_runner());
    assert_eq!(
        result,
        Some(PostFilterResult {
            nominated_node: String::new(),
            victims: vec![]
        })
    );
    assert_eq!(st.code, Code::Unschedulable);
    assert_eq!(
        st.reasons,
        vec!["preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."]
    );

    // The Pod does not fit even with every lower-priority Pod gone: the Filter's reason.
    let snap = snapshot(
        nodes(),
        vec![
            pod("v", "node1", "1", 1, json!({})),
            pod("w", "node2", "1", 1, json!({})),
        ],
    );
    let big = pod("p", "", "3", 20, json!({}));
    let (_, st) = plugin(vec![], None).post_filter(
        &state,
        &big,
        &snap,
        &all_unschedulable(&snap),
        &cpu_runner(),
    );
    assert_eq!(
        st.reasons,
        vec!["preemption: 0/2 nodes are available: 2 Insufficient cpu."]
    );

    // No node was Unschedulable at all.
    let filtered: HashMap<String, Status> = snap
        .nodes
        .iter()
        .map(|n| (n.name().to_string(), Status::unresolvable("x")))
        .collect();
    let (_, st) =
        plugin(vec![], None).post_filter(&state, &incoming, &snap, &filtered, &cpu_runner());
    assert_eq!(
        st.reasons,
        vec!["preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."]
    );
}

#[test]
fn candidate_search_starts_at_the_injected_offset_and_stops_at_the_wanted_number() {
    let nodes: Vec<Node> = (1..=5).map(|i| node(&format!("node{i}"), "1")).collect();
    let pods: Vec<Pod> = (1..=5)
        .map(|i| {
            pod(
                &format!("v{i}"),
                &format!("node{i}"),
                "1",
                1,
                started("2024-01-01T00:00:00Z"),
            )
        })
        .collect();
    let snap = snapshot(nodes, pods);
    let incoming = pod("p", "", "1", 20, json!({}));
    let args = json!({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 1});
    for (offset, want) in [(0, "node1"), (2, "node3"), (4, "node5"), (7, "node3")] {
        let pl = plugin(vec![], Some(args.clone())).with_offset(move |_| offset);
        let got = run(
            &pl,
            &cpu_runner(),
            &incoming,
            &snap,
            &all_unschedulable(&snap),
            &CycleState::new(),
        );
        assert_eq!(got.map_err(|e| e.1).unwrap().0, want, "offset {offset}");
    }
    // With every candidate wanted, the best of all is picked regardless of the offset.
    let pl = plugin(vec![], None).with_offset(|_| 3);
    let got = run(
        &pl,
        &cpu_runner(),
        &incoming,
        &snap,
        &all_unschedulable(&snap),
        &CycleState::new(),
    );
    assert_eq!(
        got.map_err(|e| e.1).unwrap().0,
        "node4",
        "ties go to the first found from the offset"
    );
}

#[test]
fn number_of_candidates_follows_the_args() {
    let pl = plugin(vec![], None);
    for (nodes, want) in [(10, 10), (100, 100), (1000, 100), (5000, 500)] {
        assert_eq!(pl.num_candidates(nodes), want, "{nodes} nodes");
    }
    let pl = plugin(
        vec![],
        Some(json!({"minCandidateNodesPercentage": 50, "minCandidateNodesAbsolute": 0})),
    );
    assert_eq!(pl.num_candidates(10), 5);
    for (args, field) in [
        (
            json!({"minCandidateNodesPercentage": 101}),
            "minCandidateNodesPercentage",
        ),
        (
            json!({"minCandidateNodesAbsolute": -1}),
            "minCandidateNodesAbsolute",
        ),
        (
            json!({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 0}),
            "minCandidateNodesPercentage",
        ),
        (
            json!({"minCandidateNodesPercentage": "ten"}),
            "minCandidateNodesPercentage",
        ),
        (json!({"other": 1}), "other"),
    ] {
        let e = decode::<DefaultPreemptionArgs>(Some(&args), "args").unwrap_err();
        assert!(e.contains(field), "{args}: {e}");
    }
}

#[test]
fn preemption_simulates_victims_through_prefilter_extensions() {
    // The incoming Pod has required anti-affinity to app=x per host; node1's only app=x Pod is a
    // lower-priority victim, node2's is of higher priority. Only node1 can be helped, and only
    // because InterPodAffinity's remove_pod forgets the victim.
    let ipa = Arc::new(InterPodAffinity::new(valid(None), 1));
    let runner = Runner {
        pre: vec![ipa.clone()],
        filters: vec![Arc::new(CpuFit), ipa.clone()],
    };
    let x = json!({"metadata": {"labels": {"app": "x"}}});
    let snap = snapshot(
        vec![node("node1", "4"), node("node2", "4")],
        vec![
            pod("keep", "node1", "1", 1, json!({})),
            pod("victim", "node1", "1", 1, x.clone()),
            pod("strong", "node2", "1", 100, x),
        ],
    );
    let incoming = pod(
        "p",
        "",
        "1",
        20,
        json!({"spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
        ]}}}}),
    );
    let mut state = CycleState::new();
    assert!(ipa.pre_filter(&mut state, &incoming, &snap).1.is_success());
    let filtered: HashMap<String, Status> = snap
        .nodes
        .iter()
        .map(|n| {
            (
                n.name().to_string(),
                runner.run_filters(&state, &incoming, n),
            )
        })
        .collect();
    assert!(
        filtered.values().all(|s| s.code == Code::Unschedulable),
        "{filtered:?}"
    );
    let got = run(
        &plugin(vec![], None),
        &runner,
        &incoming,
        &snap,
        &filtered,
        &state,
    );
    assert_eq!(
        got.map_err(|e| e.1),
        Ok(("node1".to_string(), names(&["victim"])))
    );
}

/// Upstream's test priorities and sizes (default_preemption_test.go): nodes of 500m, Pods of
/// 100m / 200m / 300m / 500m (memory in the same proportion there, so CPU alone decides here).
const NEG: i32 = -100;
const LOW: i32 = 0;
const MID: i32 = 100;
const HIGH: i32 = 1000;
const VERY_HIGH: i32 = 10000;
const SMALL: &str = "100m";
const MEDIUM: &str = "200m";
const LARGE: &str = "300m";
const VERY_LARGE: &str = "500m";

/// Upstream's epochTime + n (nanoseconds there; seconds here, the order is the same).
fn epoch(n: u32) -> Value {
    started(&format!("1970-01-01T00:00:{n:02}Z"))
}

#[test]
fn upstream_select_best_candidate_rows() {
    // TestSelectBestCandidate, each row: the nodes (500m each), the preemptor (priority, size)
    // and the Pods as (name, node, size, priority, start), and the node upstream picks.
    type Row<'a> = (
        &'a str,
        &'a [&'a str],
        (i32, &'a str),
        Vec<(&'a str, &'a str, &'a str, i32, u32)>,
        &'a str,
    );
    let three: &[&str] = &["node1", "node2", "node3"];
    let rows: Vec<Row> = vec![
        (
            "the node whose highest-priority victim is lowest",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", MEDIUM, MID, 0),
                ("p1.2", "node1", LARGE, MID, 0),
                ("p2.1", "node2", MEDIUM, MID, 0),
                ("p2.2", "node2", MEDIUM, LOW, 0),
                ("p3.1", "node3", MEDIUM, LOW, 0),
                ("p3.2", "node3", MEDIUM, LOW, 0),
            ],
            "node3",
        ),
        (
            "highest priorities equal: the smallest priority sum",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", MEDIUM, MID, 0),
                ("p1.2", "node1", LARGE, MID, 0),
                ("p2.1", "node2", LARGE, MID, 0),
                ("p2.2", "node2", MEDIUM, LOW, 0),
                ("p3.1", "node3", MEDIUM, MID, 0),
                ("p3.2", "node3", MEDIUM, MID, 0),
            ],
            "node2",
        ),
        (
            "highest priority and sum equal: the fewest victims",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", SMALL, MID, 0),
                ("p1.2", "node1", SMALL, NEG, 0),
                ("p1.3", "node1", SMALL, MID, 0),
                ("p1.4", "node1", SMALL, NEG, 0),
                ("p2.1", "node2", LARGE, MID, 0),
                ("p2.2", "node2", MEDIUM, NEG, 0),
                ("p3.1", "node3", MEDIUM, MID, 0),
                ("p3.2", "node3", SMALL, NEG, 0),
                ("p3.3", "node3", SMALL, LOW, 0),
            ],
            "node2",
        ),
        (
            "the sum adds 2^31 to every priority, so fewer negative victims win",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", SMALL, MID, 0),
                ("p1.2", "node1", SMALL, NEG, 0),
                ("p1.3", "node1", SMALL, NEG, 0),
                ("p2.1", "node2", LARGE, MID, 0),
                ("p2.2", "node2", MEDIUM, NEG, 0),
                ("p3.1", "node3", MEDIUM, MID, 0),
                ("p3.2", "node3", SMALL, NEG, 0),
                ("p3.3", "node3", SMALL, LOW, 0),
            ],
            "node2",
        ),
        (
            "lowest highest priority, sum and count each point elsewhere: the first criterion, \
             then the sum",
            &["node1", "node2", "node3", "node4"],
            (VERY_HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", SMALL, MID, 0),
                ("p1.2", "node1", SMALL, LOW, 0),
                ("p1.3", "node1", SMALL, LOW, 0),
                ("p2.1", "node2", LARGE, HIGH, 0),
                ("p3.1", "node3", MEDIUM, MID, 0),
                ("p3.2", "node3", SMALL, LOW, 0),
                ("p3.3", "node3", SMALL, LOW, 0),
                ("p3.4", "node3", MEDIUM, LOW, 0),
                ("p4.1", "node4", MEDIUM, MID, 0),
                ("p4.2", "node4", SMALL, MID, 0),
                ("p4.3", "node4", SMALL, MID, 0),
                ("p4.4", "node4", SMALL, NEG, 0),
            ],
            "node1",
        ),
        (
            "all equal but each node's start time: the latest",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", MEDIUM, MID, 2),
                ("p1.2", "node1", MEDIUM, MID, 2),
                ("p2.1", "node2", MEDIUM, MID, 3),
                ("p2.2", "node2", MEDIUM, MID, 3),
                ("p3.1", "node3", MEDIUM, MID, 1),
                ("p3.2", "node3", MEDIUM, MID, 1),
            ],
            "node2",
        ),
        (
            "all equal, every start time different: the latest earliest start",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", MEDIUM, MID, 4),
                ("p1.2", "node1", MEDIUM, MID, 2),
                ("p2.1", "node2", MEDIUM, MID, 5),
                ("p2.2", "node2", MEDIUM, MID, 1),
                ("p3.1", "node3", MEDIUM, MID, 3),
                ("p3.2", "node3", MEDIUM, MID, 6),
            ],
            "node3",
        ),
        (
            "mixed priorities, same counts: the start of the highest-priority victims only",
            three,
            (HIGH, VERY_LARGE),
            vec![
                ("p1.1", "node1", MEDIUM, LOW, 4),
                ("p1.2", "node1", MEDIUM, MID, 2),
                ("p2.1", "node2", MEDIUM, MID, 6),
                ("p2.2", "node2", MEDIUM, LOW, 1),
                ("p3.1", "node3", MEDIUM, LOW, 3),
                ("p3.2", "node3", MEDIUM, MID, 5),
            ],
            "node2",
        ),
    ];
    for (name, nodes, (prio, size), pods, want) in rows {
        let nodes = nodes.iter().map(|n| node(n, VERY_LARGE)).collect();
        let pods = pods
            .into_iter()
            .map(|(p, n, cpu, pr, t)| pod(p, n, cpu, pr, epoch(t)))
            .collect();
        let snap = snapshot(nodes, pods);
        // Every node first in the search, as upstream's random offset may make it: the choice
        // must not depend on it.
        for first in 0..snap.nodes.len() {
            let pl = plugin(vec![], None).with_offset(move |_| first);
            let got = run(
                &pl,
                &cpu_runner(),
                &pod("p", "", size, prio, json!({})),
                &snap,
                &all_unschedulable(&snap),
                &CycleState::new(),
            );
            assert_eq!(
                got.map(|(n, _)| n).map_err(|e| e.1),
                Ok(want.to_string()),
                "{name} (search from node {first})"
            );
        }
    }
}

#[test]
fn upstream_dry_run_victim_rows() {
    // TestDryRunPreemption's mixed-priority rows: node1 and node2 of 500m; the preemptor high
    // and large. Victims are reprieved from the most important down (higher priority, then the
    // earlier start); node2's only Pod is not lower than the preemptor.
    type Row<'a> = (&'a str, [u32; 5], Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            "no start times: the mid Pods in node order, the small one reprieved",
            [0; 5],
            vec!["p1.2", "p1.3"],
        ),
        (
            "of the two low Pods the later-started one goes",
            [5, 4, 3, 2, 1],
            vec!["p1.1", "p1.3"],
        ),
        (
            "the same with the start times swapped",
            [4, 5, 3, 2, 1],
            vec!["p1.2", "p1.3"],
        ),
    ];
    for (name, t, want) in rows {
        let at = |i: usize| if t[i] == 0 { json!({}) } else { epoch(t[i]) };
        let (p11, p12) = if t[0] == 0 { (MID, LOW) } else { (LOW, LOW) };
        let pods = vec![
            pod("p1.1", "node1", SMALL, p11, at(0)),
            pod("p1.2", "node1", SMALL, p12, at(1)),
            pod("p1.3", "node1", MEDIUM, MID, at(2)),
            pod("p1.4", "node1", SMALL, HIGH, at(3)),
            pod("p2", "node2", LARGE, HIGH, at(4)),
        ];
        let snap = snapshot(
            vec![node("node1", VERY_LARGE), node("node2", VERY_LARGE)],
            pods,
        );
        let got = run(
            &plugin(vec![], None),
            &cpu_runner(),
            &pod("p", "", LARGE, HIGH, json!({})),
            &snap,
            &all_unschedulable(&snap),
            &CycleState::new(),
        );
        let mut got = got.map_err(|e| e.1).expect(name);
        got.1.sort();
        assert_eq!(got, ("node1".to_string(), names(&want)), "{name}");
    }
}

/// Upstream's TestPodEligibleToPreemptOthers rows (v1.34), plus the Pod whose nomination this
/// scheduler holds in memory while its status write is in flight: it waits for its victims as a
/// Pod whose status shows the nomination does.
#[test]
fn upstream_pod_eligible_to_preempt_others_rows() {
    use crate::scheduler::schedule_one::with_nominated_node;
    let terminating = json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}});
    let by_preemption = json!({
        "metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"},
        "status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}
    });
    let nominated = json!({"status": {"nominatedNodeName": "node1"}});
    let high = |extra: Value| pod("p", "", "1", 1000, extra);
    type Row = (&'static str, Pod, Vec<Pod>, Option<Status>, bool);
    let rows: Vec<Row> = vec![
        (
            "Pod with nominated node",
            high(nominated.clone()),
            vec![pod("p1", "node1", "1", 0, terminating.clone())],
            Some(Status::unresolvable("node(s) had untolerated taint")),
            true,
        ),
        (
            "Pod without nominated node",
            high(json!({})),
            vec![],
            None,
            true,
        ),
        (
            "Pod with 'PreemptNever' preemption policy",
            high(json!({"spec": {"preemptionPolicy": "Never"}})),
            vec![],
            None,
            false,
        ),
        (
            "preemption victim pod terminating, as indicated by the dedicated DisruptionTarget condition",
            high(nominated.clone()),
            vec![pod("p1", "node1", "1", 0, by_preemption.clone())],
            Some(Status::unschedulable("Insufficient cpu")),
            false,
        ),
        (
            "non-victim Pods terminating",
            high(nominated.clone()),
            vec![pod("p1", "node1", "1", 0, terminating.clone())],
            Some(Status::unschedulable("Insufficient cpu")),
            true,
        ),
        (
            "nominated in memory only (its status write not observed yet), victim terminating",
            (*with_nominated_node(&Arc::new(high(json!({}))), Some("node1"))).clone(),
            vec![pod("p1", "node1", "1", 0, by_preemption.clone())],
            Some(Status::unschedulable("Insufficient cpu")),
            false,
        ),
        (
            "a higher-priority Pod terminating by preemption is not this Pod's victim",
            high(nominated.clone()),
            vec![pod("p1", "node1", "1", 2000, by_preemption.clone())],
            Some(Status::unschedulable("Insufficient cpu")),
            true,
        ),
    ];
    for (name, p, pods, nominated_status, want) in rows {
        let snap = snapshot(vec![node("node1", "2")], pods);
        let filtered: HashMap<String, Status> = nominated_status
            .into_iter()
            .map(|s| ("node1".to_string(), s))
            .collect();
        let got = plugin(vec![], None).eligible(&p, &snap, &filtered);
        assert_eq!(got.is_ok(), want, "{name}: {got:?}");
    }
}

#[test]
fn in_memory_nomination_fills_only_an_empty_status() {
    use crate::scheduler::schedule_one::with_nominated_node;
    let nnn = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.nominated_node_name.clone())
    };
    let bare = Arc::new(pod("p", "", "1", 10, json!({})));
    assert_eq!(
        nnn(&with_nominated_node(&bare, Some("n1"))),
        Some("n1".into())
    );
    assert_eq!(nnn(&with_nominated_node(&bare, None)), None);
    let shown = Arc::new(pod(
        "p",
        "",
        "1",
        10,
        json!({"status": {"nominatedNodeName": "n2"}}),
    ));
    assert_eq!(
        nnn(&with_nominated_node(&shown, Some("n1"))),
        Some("n2".into())
    );
}
