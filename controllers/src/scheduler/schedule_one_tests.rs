use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use super::*;
use crate::scheduler::framework::{
    FilterPlugin, Plugin, PodInfo, PreFilterPlugin, PreFilterResult, ScorePlugin,
};

/// Rejects nodes whose CPU would be overcommitted ("Insufficient cpu", Unschedulable).
struct Cpu;
impl Plugin for Cpu {
    fn name(&self) -> &'static str {
        "Cpu"
    }
}
impl FilterPlugin for Cpu {
    fn filter(&self, _: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        let want = crate::scheduler::framework::types::pod_requests(pod, false).milli_cpu;
        if node.requested.milli_cpu + want > node.allocatable.milli_cpu {
            return Status::unschedulable("Insufficient cpu");
        }
        Status::success()
    }
}

/// Rejects nodes labelled `tainted` as unresolvable.
struct Taint;
impl Plugin for Taint {
    fn name(&self) -> &'static str {
        "Taint"
    }
}
impl FilterPlugin for Taint {
    fn filter(&self, _: &CycleState, _: &Pod, node: &NodeInfo) -> Status {
        let tainted = node
            .node
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref())
            .is_some_and(|l| l.contains_key("tainted"));
        if tainted {
            return Status::unresolvable("node(s) had untolerated taint(s)");
        }
        Status::success()
    }
}

/// Restricts the nodes to a fixed set (or rejects at PreFilter).
struct Only(Option<BTreeSet<String>>, Option<Status>);
impl Plugin for Only {
    fn name(&self) -> &'static str {
        "Only"
    }
}
impl PreFilterPlugin for Only {
    fn pre_filter(
        &self,
        _: &mut CycleState,
        _: &Pod,
        _: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        if let Some(s) = &self.1 {
            return (None, s.clone());
        }
        (
            Some(PreFilterResult {
                node_names: self.0.clone(),
            }),
            Status::success(),
        )
    }
}

/// Scores from a table by node name; panics when told to (proves scoring was skipped).
struct Table(&'static str, HashMap<&'static str, i64>, bool);
impl Plugin for Table {
    fn name(&self) -> &'static str {
        self.0
    }
}
impl ScorePlugin for Table {
    fn score(&self, _: &CycleState, _: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        assert!(!self.2, "{} must not be called", self.0);
        Ok(self.1.get(node.name()).copied().unwrap_or(0))
    }
}

fn node(name: &str, cpu: &str, tainted: bool) -> NodeInfo {
    let labels = if tainted {
        json!({"tainted": "yes"})
    } else {
        json!({})
    };
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "pods": "110"}}
    }))
    .unwrap();
    NodeInfo::new(Arc::new(n))
}

fn pod(name: &str, cpu: &str, priority: i32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"priority": priority, "containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu}}}
        ]}
    }))
    .unwrap()
}

fn fw(filters: Vec<Arc<dyn FilterPlugin>>, score: Vec<(Arc<dyn ScorePlugin>, i64)>) -> Framework {
    Framework {
        name: "default-scheduler".into(),
        filter: filters,
        score,
        ..Framework::default()
    }
}

fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    Snapshot::new(nodes, HashMap::new())
}

fn run(f: &Framework, snap: &Snapshot, p: &Pod, nominated: &Nominations) -> Result<String, String> {
    let mut alg = Algorithm::new(16, 0);
    alg.schedule_pod(f, &mut CycleState::new(), p, snap, nominated)
        .map(|r| r.node)
        .map_err(|e| e.to_string())
}

#[test]
fn schedule_cases() {
    let cpu_taint: Vec<Arc<dyn FilterPlugin>> = vec![Arc::new(Taint), Arc::new(Cpu)];
    let three = || {
        snapshot(vec![
            node("n1", "1", false),
            node("n2", "4", true),
            node("n3", "4", true),
        ])
    };
    let none = Nominations::new();
    let scores = |m: &[(&'static str, i64)]| m.iter().copied().collect::<HashMap<_, _>>();
    type Case<'a> = (&'a str, Framework, Snapshot, Pod, Result<&'a str, &'a str>);
    let cases: Vec<Case> = vec![
        (
            "SCH-3 no node fits: FitError counts reasons per node, sorted",
            fw(cpu_taint.clone(), vec![]),
            three(),
            pod("p", "2", 0),
            Err("0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint(s)."),
        ),
        (
            "SCH-3 exactly one feasible node is chosen without scoring",
            fw(
                cpu_taint.clone(),
                vec![(Arc::new(Table("Never", HashMap::new(), true)), 1)],
            ),
            three(),
            pod("p", "500m", 0),
            Ok("n1"),
        ),
        (
            "SCH-4 weighted scores add up: 2 x 10 beats 1 x 15",
            fw(
                vec![],
                vec![
                    (Arc::new(Table("A", scores(&[("n1", 10)]), false)), 2),
                    (Arc::new(Table("B", scores(&[("n2", 15)]), false)), 1),
                ],
            ),
            three(),
            pod("p", "1", 0),
            Ok("n1"),
        ),
        (
            "a score outside 0..=100 after normalizing is an error",
            fw(
                vec![],
                vec![(Arc::new(Table("Big", scores(&[("n1", 101)]), false)), 1)],
            ),
            three(),
            pod("p", "1", 0),
            Err("plugin \"Big\" returns an invalid score 101, it should in the range of [0, 100] after normalizing"),
        ),
        (
            "PreFilter narrowing: nodes left out count as not satisfying the plugin",
            Framework {
                pre_filter: vec![Arc::new(Only(
                    Some(["n2".to_string()].into_iter().collect()),
                    None,
                ))],
                ..fw(cpu_taint.clone(), vec![])
            },
            three(),
            pod("p", "1", 0),
            Err("0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't satisfy plugin(s) [Only]."),
        ),
        (
            "PreFilter rejection: its message only",
            Framework {
                pre_filter: vec![Arc::new(Only(None, Some(Status::unresolvable("no way"))))],
                ..fw(cpu_taint.clone(), vec![])
            },
            three(),
            pod("p", "1", 0),
            Err("0/3 nodes are available: no way."),
        ),
        (
            "PreFilter node sets that do not intersect",
            Framework {
                pre_filter: vec![
                    Arc::new(Only(Some(["n1".to_string()].into_iter().collect()), None)),
                    Arc::new(Only(Some(["n2".to_string()].into_iter().collect()), None)),
                ],
                ..fw(cpu_taint.clone(), vec![])
            },
            three(),
            pod("p", "1", 0),
            Err("0/3 nodes are available: node(s) didn't satisfy plugin(s) [Only Only] simultaneously."),
        ),
        (
            "no nodes at all",
            fw(cpu_taint.clone(), vec![]),
            snapshot(vec![]),
            pod("p", "1", 0),
            Err("no nodes available to schedule pods"),
        ),
    ];
    for (name, f, snap, p, want) in cases {
        let got = run(&f, &snap, &p, &none);
        assert_eq!(got.as_deref().map_err(|e| e.as_str()), want, "{name}");
    }
}

#[test]
fn nominated_pods_of_equal_or_higher_priority_count_in_filter() {
    let f = fw(vec![Arc::new(Cpu)], vec![]);
    let snap = snapshot(vec![node("n1", "2", false)]);
    let nominated_pod = |prio| {
        let mut m = Nominations::new();
        m.insert(
            "n1".to_string(),
            vec![PodInfo::new(Arc::new(pod("other", "1500m", prio)))],
        );
        m
    };
    let cases = [
        (
            "higher-priority nominated pod takes the room",
            nominated_pod(10),
            Err(()),
        ),
        (
            "equal-priority nominated pod takes the room",
            nominated_pod(5),
            Err(()),
        ),
        (
            "lower-priority nominated pod is ignored",
            nominated_pod(1),
            Ok("n1"),
        ),
    ];
    for (name, nominated, want) in cases {
        let got = run(&f, &snap, &pod("p", "1", 5), &nominated);
        assert_eq!(got.as_deref().map_err(|_| ()), want, "{name}");
    }
    // The pod itself, nominated to the node, does not block itself.
    let mut me = Nominations::new();
    me.insert("n1".into(), vec![PodInfo::new(Arc::new(pod("p", "1", 5)))]);
    assert_eq!(run(&f, &snap, &pod("p", "1", 5), &me).as_deref(), Ok("n1"));
}

#[test]
fn nominated_node_is_tried_first() {
    // All nodes fit; without a nomination the higher score would win.
    let f = fw(
        vec![Arc::new(Cpu)],
        vec![(
            Arc::new(Table("A", [("n1", 100)].into_iter().collect(), false)),
            1,
        )],
    );
    let snap = snapshot(vec![node("n1", "4", false), node("n2", "4", false)]);
    let mut p = pod("p", "1", 0);
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        nominated_node_name: Some("n2".into()),
        ..Default::default()
    });
    assert_eq!(run(&f, &snap, &p, &Nominations::new()).as_deref(), Ok("n2"));
}

#[test]
fn num_feasible_nodes_to_find_is_upstreams() {
    let cases = [
        ("fewer than 100 nodes: all", 0, 50, 50),
        ("100 nodes: all", 0, 100, 100),
        ("adaptive 1000 nodes: 42 %", 0, 1000, 420),
        ("adaptive 5000 nodes: 10 %", 0, 5000, 500),
        ("adaptive 10000 nodes: floor of 5 %", 0, 10000, 500),
        ("configured 10 % of 500: at least 100", 10, 500, 100),
        ("configured 100 %", 100, 500, 500),
    ];
    for (name, pct, nodes, want) in cases {
        assert_eq!(num_feasible_nodes_to_find(pct, nodes), want, "{name}");
    }
}

#[test]
fn filter_stops_at_the_percentage_and_the_next_search_starts_after() {
    let nodes: Vec<NodeInfo> = (0..300)
        .map(|i| node(&format!("n{i:03}"), "4", false))
        .collect();
    let snap = snapshot(nodes);
    let f = Framework {
        percentage_of_nodes_to_score: Some(50),
        ..fw(
            vec![Arc::new(Cpu)],
            vec![(Arc::new(Table("A", HashMap::new(), false)), 1)],
        )
    };
    let mut alg = Algorithm::new(16, 0);
    // One worker: which nodes are found first is then deterministic.
    alg.workers = 1;
    let p = pod("p", "1", 0);
    let (feasible, _) = alg
        .find_nodes_that_fit(&f, &mut CycleState::new(), &p, &snap, &Nominations::new())
        .unwrap();
    assert_eq!(feasible.len(), 150);
    assert_eq!(alg.next_start_node_index, 150);
    let (feasible, _) = alg
        .find_nodes_that_fit(&f, &mut CycleState::new(), &p, &snap, &Nominations::new())
        .unwrap();
    assert_eq!(
        feasible[0].name(),
        "n150",
        "the search resumes where it stopped"
    );
}

#[test]
fn select_host_breaks_ties_at_random() {
    let mut rng = rand::thread_rng();
    let mut seen = BTreeMap::new();
    for _ in 0..200 {
        *seen
            .entry(select_host(&[5, 9, 1, 9, 9], &mut rng))
            .or_insert(0) += 1;
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [1, 3, 4]);
    assert_eq!(select_host(&[3], &mut rng), 0);
}

#[test]
fn fit_error_message_is_kube_schedulers() {
    let status = |r: &str| Status::unschedulable(r);
    let mut d = Diagnosis::default();
    for (n, r) in [
        ("a", "Insufficient cpu"),
        ("b", "Insufficient cpu"),
        ("c", "x"),
    ] {
        d.node_to_status.insert(n.into(), status(r));
    }
    let cases = [
        (
            "reasons counted and sorted as strings",
            "",
            "0/3 nodes are available: 1 x, 2 Insufficient cpu.",
        ),
        (
            "PostFilter message appended with one period",
            "no new claims to deallocate, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
            "0/3 nodes are available: 1 x, 2 Insufficient cpu. no new claims to deallocate, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
        ),
    ];
    for (name, post, want) in cases {
        let mut diagnosis = d.clone();
        diagnosis.post_filter_msg = post.into();
        let e = FitError {
            num_all_nodes: 3,
            diagnosis,
        };
        assert_eq!(e.to_string(), want, "{name}");
    }
    // A PreFilter rejection leaves DynamicResources' PostFilter without its state: its error is
    // appended as it is (observed from kube-scheduler v1.34 in the differential suite).
    let e = FitError {
        num_all_nodes: 3,
        diagnosis: Diagnosis {
            pre_filter_msg: "pod has unbound immediate PersistentVolumeClaims".into(),
            post_filter_msg: "not found".into(),
            post_filter_error: true,
            ..Default::default()
        },
    };
    assert_eq!(
        e.to_string(),
        "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"
    );
}
