//! Named cases for NodeResourcesFit, after upstream's fit_test.go (TestEnoughRequests,
//! TestNotEnoughRequests, TestStorageRequests, TestFitScore) and the strategy tables
//! (least_allocated_test.go, most_allocated_test.go, requested_to_capacity_ratio_test.go).

use super::*;
use crate::scheduler::framework::Code;
use crate::scheduler::plugin_args::{decode, valid, PluginArgs};
use crate::scheduler::plugins::helper::test_util::*;
use serde_json::{json, Value};

/// A Pod with one container per requests map (none: no containers at all, as upstream's
/// `st.MakePod().Obj()`), plus init containers.
fn req_pod(name: &str, containers: &[Value], init: &[Value]) -> Pod {
    let c = |prefix: &str, reqs: &[Value]| -> Value {
        reqs.iter()
            .enumerate()
            .map(|(i, r)| json!({"name": format!("{prefix}{i}"), "resources": {"requests": r}}))
            .collect()
    };
    let mut p = pod(json!({"metadata": {"name": name, "uid": name}}));
    let spec = p.spec.as_mut().unwrap();
    spec.containers = serde_json::from_value(c("c", containers)).unwrap();
    if !init.is_empty() {
        spec.init_containers = Some(serde_json::from_value(c("i", init)).unwrap());
    }
    p
}

/// upstream `newResourcePod(Resource{MilliCPU: cpu, Memory: mem})`.
fn cm(cpu: i64, mem: i64) -> Value {
    json!({"cpu": format!("{cpu}m"), "memory": mem.to_string(), "ephemeral-storage": "0"})
}

/// upstream's `makeAllocatableResources(10, 20, pods, 5, 20, 5)`.
fn small_node(pods: i64, existing: Vec<Pod>) -> NodeInfo {
    node_info(
        node(
            "node",
            json!({"status": {"allocatable": {
                "cpu": "10m", "memory": "20", "pods": pods.to_string(),
                "example.com/aaa": "5", "ephemeral-storage": "20", "hugepages-2Mi": "5"}}}),
        ),
        existing,
    )
}

fn filter_one(args: Option<Value>, p: &Pod, n: NodeInfo) -> Status {
    let pl = NodeResourcesFit::new(&valid(args.as_ref()));
    run_filter(Some(&pl), &pl, p, &snapshot(vec![n])).remove(0)
}

#[test]
fn filter_matches_upstream_enough_requests() {
    let cpu = "Insufficient cpu";
    let mem = "Insufficient memory";
    let aaa = "Insufficient example.com/aaa";
    let bbb = "Insufficient example.com/bbb";
    let kio = "Insufficient kubernetes.io/something";
    let hp = "Insufficient hugepages-2Mi";
    let unsch = |r: &[&str]| status(Code::Unschedulable, r);
    let x = |cpu: i64, mem: i64, scalars: Value| {
        let mut v = cm(cpu, mem);
        json_patch::merge(&mut v, &scalars);
        v
    };
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Option<Value>, Pod, Vec<Pod>, Status)> = vec![
        (
            "no resources requested always fits",
            None,
            req_pod("p", &[], &[]),
            vec![req_pod("e", &[cm(10, 20)], &[])],
            ok(),
        ),
        (
            "too many resources fails",
            None,
            req_pod("p", &[cm(1, 1)], &[]),
            vec![req_pod("e", &[cm(10, 20)], &[])],
            unsch(&[cpu, mem]),
        ),
        (
            "too many resources fails due to init container cpu",
            None,
            req_pod("p", &[cm(1, 1)], &[cm(3, 1)]),
            vec![req_pod("e", &[cm(8, 19)], &[])],
            unsch(&[cpu]),
        ),
        (
            "too many resources fails due to highest init container cpu",
            None,
            req_pod("p", &[cm(1, 1)], &[cm(3, 1), cm(2, 1)]),
            vec![req_pod("e", &[cm(8, 19)], &[])],
            unsch(&[cpu]),
        ),
        (
            "too many resources fails due to init container memory",
            None,
            req_pod("p", &[cm(1, 1)], &[cm(1, 3)]),
            vec![req_pod("e", &[cm(9, 19)], &[])],
            unsch(&[mem]),
        ),
        (
            "init container fits because it's the max, not sum, of containers and init containers",
            None,
            req_pod("p", &[cm(1, 1)], &[cm(1, 1), cm(1, 1)]),
            vec![req_pod("e", &[cm(9, 19)], &[])],
            ok(),
        ),
        (
            "both resources fit",
            None,
            req_pod("p", &[cm(1, 1)], &[]),
            vec![req_pod("e", &[cm(5, 5)], &[])],
            ok(),
        ),
        (
            "one resource memory fits",
            None,
            req_pod("p", &[cm(2, 1)], &[]),
            vec![req_pod("e", &[cm(9, 5)], &[])],
            unsch(&[cpu]),
        ),
        (
            "one resource cpu fits",
            None,
            req_pod("p", &[cm(1, 2)], &[]),
            vec![req_pod("e", &[cm(5, 19)], &[])],
            unsch(&[mem]),
        ),
        (
            "equal edge case",
            None,
            req_pod("p", &[cm(5, 1)], &[]),
            vec![req_pod("e", &[cm(5, 19)], &[])],
            ok(),
        ),
        (
            "equal edge case for init container",
            None,
            req_pod("p", &[cm(4, 1)], &[cm(5, 1)]),
            vec![req_pod("e", &[cm(5, 19)], &[])],
            ok(),
        ),
        (
            "extended resource fits",
            None,
            req_pod("p", &[json!({"example.com/aaa": "1"})], &[]),
            vec![req_pod("e", &[cm(0, 0)], &[])],
            ok(),
        ),
        (
            "extended resource capacity enforced: more than allocatable is unresolvable",
            None,
            req_pod("p", &[x(1, 1, json!({"example.com/aaa": "10"}))], &[]),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "0"}))],
                &[],
            )],
            unresolvable(&[aaa]),
        ),
        (
            "extended resource capacity enforced for init container",
            None,
            req_pod("p", &[], &[x(1, 1, json!({"example.com/aaa": "10"}))]),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "0"}))],
                &[],
            )],
            unresolvable(&[aaa]),
        ),
        (
            "extended resource allocatable enforced: used up is unschedulable",
            None,
            req_pod("p", &[x(1, 1, json!({"example.com/aaa": "1"}))], &[]),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "5"}))],
                &[],
            )],
            unsch(&[aaa]),
        ),
        (
            "extended resource allocatable enforced for multiple containers",
            None,
            req_pod(
                "p",
                &[
                    x(1, 1, json!({"example.com/aaa": "3"})),
                    x(1, 1, json!({"example.com/aaa": "3"})),
                ],
                &[],
            ),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "2"}))],
                &[],
            )],
            unresolvable(&[aaa]),
        ),
        (
            "extended resource allocatable admits multiple init containers",
            None,
            req_pod(
                "p",
                &[],
                &[
                    x(1, 1, json!({"example.com/aaa": "3"})),
                    x(1, 1, json!({"example.com/aaa": "3"})),
                ],
            ),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "2"}))],
                &[],
            )],
            ok(),
        ),
        (
            "extended resource allocatable enforced for unknown resource",
            None,
            req_pod("p", &[x(1, 1, json!({"example.com/bbb": "1"}))], &[]),
            vec![req_pod("e", &[cm(0, 0)], &[])],
            unresolvable(&[bbb]),
        ),
        (
            "kubernetes.io resource capacity enforced",
            None,
            req_pod(
                "p",
                &[x(1, 1, json!({"kubernetes.io/something": "10"}))],
                &[],
            ),
            vec![req_pod("e", &[cm(0, 0)], &[])],
            unresolvable(&[kio]),
        ),
        (
            "hugepages resource capacity enforced",
            None,
            req_pod("p", &[x(1, 1, json!({"hugepages-2Mi": "10"}))], &[]),
            vec![req_pod("e", &[x(0, 0, json!({"hugepages-2Mi": "0"}))], &[])],
            unresolvable(&[hp]),
        ),
        (
            "hugepages resource allocatable enforced for multiple containers",
            None,
            req_pod(
                "p",
                &[
                    x(1, 1, json!({"hugepages-2Mi": "3"})),
                    x(1, 1, json!({"hugepages-2Mi": "3"})),
                ],
                &[],
            ),
            vec![req_pod("e", &[x(0, 0, json!({"hugepages-2Mi": "2"}))], &[])],
            unresolvable(&[hp]),
        ),
        (
            "skip checking ignored extended resource",
            Some(json!({"ignoredResources": ["example.com/bbb"]})),
            req_pod("p", &[x(1, 1, json!({"example.com/bbb": "1"}))], &[]),
            vec![req_pod("e", &[cm(0, 0)], &[])],
            ok(),
        ),
        (
            "resources + pod overhead fits",
            None,
            {
                let mut p = req_pod("p", &[cm(1, 1)], &[]);
                p.spec.as_mut().unwrap().overhead =
                    Some(serde_json::from_value(json!({"cpu": "3m", "memory": "13"})).unwrap());
                p
            },
            vec![req_pod("e", &[cm(5, 5)], &[])],
            ok(),
        ),
        (
            "requests + overhead does not fit for memory",
            None,
            {
                let mut p = req_pod("p", &[cm(1, 1)], &[]);
                p.spec.as_mut().unwrap().overhead =
                    Some(serde_json::from_value(json!({"cpu": "1m", "memory": "15"})).unwrap());
                p
            },
            vec![req_pod("e", &[cm(5, 5)], &[])],
            unsch(&[mem]),
        ),
        (
            "ignored resource groups skip only extended resources",
            Some(json!({"ignoredResourceGroups": ["example.com"]})),
            req_pod(
                "p",
                &[x(
                    1,
                    1,
                    json!({"example.com/bbb": "1", "kubernetes.io/something": "1"}),
                )],
                &[],
            ),
            vec![req_pod("e", &[cm(0, 0)], &[])],
            unresolvable(&[kio]),
        ),
        (
            "an extended resource requested with quantity zero is not checked",
            None,
            req_pod("p", &[x(1, 1, json!({"example.com/aaa": "0"}))], &[]),
            vec![req_pod(
                "e",
                &[x(0, 0, json!({"example.com/aaa": "6"}))],
                &[],
            )],
            ok(),
        ),
        (
            "pod-level requests replace the containers' and fit",
            None,
            {
                let mut p = req_pod("p", &[cm(1, 1)], &[]);
                p.spec.as_mut().unwrap().resources = Some(
                    serde_json::from_value(json!({"requests": {"cpu": "1m", "memory": "2"}}))
                        .unwrap(),
                );
                p
            },
            vec![req_pod("e", &[cm(5, 5)], &[])],
            ok(),
        ),
        (
            "pod-level cpu does not fit",
            None,
            {
                let mut p = req_pod("p", &[cm(1, 1)], &[]);
                p.spec.as_mut().unwrap().resources = Some(
                    serde_json::from_value(json!({"requests": {"cpu": "7m", "memory": "2"}}))
                        .unwrap(),
                );
                p
            },
            vec![req_pod("e", &[cm(5, 5)], &[])],
            unsch(&[cpu]),
        ),
        // TestStorageRequests.
        (
            "ephemeral storage over allocatable is unresolvable",
            None,
            req_pod("p", &[json!({"ephemeral-storage": "25"})], &[]),
            vec![req_pod("e", &[cm(2, 2)], &[])],
            unresolvable(&["Insufficient ephemeral-storage"]),
        ),
        (
            "ephemeral storage is sufficient",
            None,
            req_pod("p", &[json!({"ephemeral-storage": "5"})], &[]),
            vec![req_pod(
                "e",
                &[json!({"cpu": "2m", "memory": "2", "ephemeral-storage": "10"})],
                &[],
            )],
            ok(),
        ),
        (
            "ephemeral storage used up is unschedulable",
            None,
            req_pod("p", &[json!({"ephemeral-storage": "11"})], &[]),
            vec![req_pod(
                "e",
                &[json!({"cpu": "2m", "memory": "2", "ephemeral-storage": "10"})],
                &[],
            )],
            unsch(&["Insufficient ephemeral-storage"]),
        ),
    ];
    for (name, args, p, existing, want) in cases {
        assert_eq!(
            filter_one(args, &p, small_node(32, existing)),
            want,
            "{name}"
        );
    }
}

#[test]
fn filter_too_many_pods_comes_first() {
    // TestNotEnoughRequests: allocatable pods 1, one Pod already there.
    let cases = [
        (
            "without requests",
            req_pod("p", &[], &[]),
            vec![ERR_REASON_TOO_MANY_PODS],
        ),
        (
            "even when the resources fit",
            req_pod("p", &[cm(1, 1)], &[]),
            vec![ERR_REASON_TOO_MANY_PODS],
        ),
        (
            "equal edge case",
            req_pod("p", &[cm(5, 1)], &[]),
            vec![ERR_REASON_TOO_MANY_PODS],
        ),
        (
            "listed before the resources that do not fit",
            req_pod("p", &[cm(6, 1)], &[]),
            vec![ERR_REASON_TOO_MANY_PODS, "Insufficient cpu"],
        ),
    ];
    for (name, p, reasons) in cases {
        let got = filter_one(
            None,
            &p,
            small_node(1, vec![req_pod("e", &[cm(5, 19)], &[])]),
        );
        assert_eq!(got, status(Code::Unschedulable, &reasons), "{name}");
    }
}

#[test]
fn filter_without_prefilter_state_is_an_error() {
    let pl = NodeResourcesFit::new(&valid(None));
    let n = small_node(32, vec![]);
    let s = pl.filter(&CycleState::new(), &req_pod("p", &[], &[]), &n);
    assert_eq!(s.code, Code::Error);
}

#[test]
fn fits_lists_what_the_node_lacks() {
    let n = small_node(32, vec![req_pod("e", &[cm(8, 19)], &[])]);
    let got = fits(&req_pod("p", &[cm(3, 12)], &[]), &n);
    assert_eq!(
        got,
        vec![
            InsufficientResource {
                resource: "cpu".into(),
                reason: "Insufficient cpu".into(),
                requested: 3,
                used: 8,
                capacity: 10,
                unresolvable: false,
            },
            InsufficientResource {
                resource: "memory".into(),
                reason: "Insufficient memory".into(),
                requested: 12,
                used: 19,
                capacity: 20,
                unresolvable: false,
            },
        ]
    );
}

/// A node with this allocatable (upstream `st.MakeNode().Capacity(...)`) and these Pods.
fn cap_node(name: &str, alloc: Value, pods: Vec<Pod>) -> NodeInfo {
    node_info(node(name, json!({"status": {"allocatable": alloc}})), pods)
}

/// upstream `Req(map{"cpu": c, "memory": m})`: whole cores and bytes.
fn r(cpu: &str, mem: &str) -> Value {
    json!({"cpu": cpu, "memory": mem})
}

fn strategy(type_: &str, resources: Value, shape: Option<Value>) -> Value {
    let mut s = json!({"type": type_, "resources": resources});
    if let Some(shape) = shape {
        s["requestedToCapacityRatio"] = json!({"shape": shape});
    }
    json!({"scoringStrategy": s})
}

/// Name, args, the Pod, the nodes with their Pods, the scores.
type ScoreCase = (&'static str, Value, Pod, Vec<NodeInfo>, Vec<i64>);

#[test]
fn score_matches_upstream_strategy_tables() {
    let default_res = json!([{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]);
    let least = strategy(LEAST_ALLOCATED, default_res.clone(), None);
    let most = strategy(MOST_ALLOCATED, default_res.clone(), None);
    let two_nodes = |c1: Value, p1: Vec<Pod>, c2: Value, p2: Vec<Pod>| {
        vec![cap_node("node1", c1, p1), cap_node("node2", c2, p2)]
    };
    let fit_nodes = || {
        two_nodes(
            r("4000", "10000"),
            vec![req_pod("e1", &[r("2000", "4000")], &[])],
            r("6000", "10000"),
            vec![req_pod("e2", &[r("1000", "2000")], &[])],
        )
    };
    let cases: Vec<ScoreCase> = vec![
        // TestFitScore.
        (
            "RequestedToCapacityRatio case1",
            strategy(
                REQUESTED_TO_CAPACITY_RATIO,
                default_res.clone(),
                Some(json!([{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}])),
            ),
            req_pod("p", &[r("3000", "5000")], &[]),
            fit_nodes(),
            vec![10, 32],
        ),
        (
            "RequestedToCapacityRatio case2",
            strategy(
                REQUESTED_TO_CAPACITY_RATIO,
                default_res.clone(),
                Some(json!([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}])),
            ),
            req_pod("p", &[r("3000", "5000")], &[]),
            fit_nodes(),
            vec![95, 68],
        ),
        (
            "MostAllocated",
            most.clone(),
            req_pod("p", &[r("1000", "2000")], &[]),
            fit_nodes(),
            vec![67, 36],
        ),
        (
            "LeastAllocated",
            least.clone(),
            req_pod("p", &[r("1000", "2000")], &[]),
            fit_nodes(),
            vec![32, 63],
        ),
        (
            "MostAllocated counts an existing Pod's sidecar",
            most.clone(),
            req_pod("p", &[r("1000", "2000")], &[]),
            two_nodes(
                r("4000", "10000"),
                vec![{
                    let mut p = req_pod("e1", &[r("1000", "2000")], &[r("1000", "2000")]);
                    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
                        Some("Always".into());
                    p
                }],
                r("4000", "10000"),
                vec![req_pod("e2", &[r("1000", "2000")], &[])],
            ),
            vec![67, 45],
        ),
        // least_allocated_test.go.
        (
            "least: nothing scheduled, nothing requested",
            least.clone(),
            req_pod("p", &[], &[]),
            two_nodes(r("4000", "10000"), vec![], r("4000", "10000"), vec![]),
            vec![100, 100],
        ),
        (
            "least: nothing scheduled, differently sized nodes",
            least.clone(),
            req_pod("p", &[r("1000", "2000"), r("2000", "3000")], &[]),
            two_nodes(r("4000", "10000"), vec![], r("6000", "10000"), vec![]),
            vec![37, 50],
        ),
        (
            "least: no resources requested, pods scheduled with resources",
            least.clone(),
            req_pod("p", &[], &[]),
            two_nodes(
                r("10000", "20000"),
                vec![
                    req_pod("a", &[r("3000", "0")], &[]),
                    req_pod("b", &[r("3000", "0")], &[]),
                ],
                r("10000", "20000"),
                vec![
                    req_pod("c", &[r("3000", "0")], &[]),
                    req_pod("d", &[r("3000", "5000")], &[]),
                ],
            ),
            vec![70, 57],
        ),
        (
            "least: resources requested, differently sized nodes",
            least.clone(),
            req_pod("p", &[r("1000", "2000"), r("2000", "3000")], &[]),
            two_nodes(
                r("10000", "20000"),
                vec![req_pod("a", &[r("3000", "0")], &[])],
                r("10000", "50000"),
                vec![req_pod("c", &[r("3000", "5000")], &[])],
            ),
            vec![57, 60],
        ),
        (
            "least: requested resources exceed node capacity",
            least.clone(),
            req_pod("p", &[r("3000", "0")], &[]),
            two_nodes(
                r("4000", "10000"),
                vec![req_pod("a", &[r("3000", "0")], &[])],
                r("4000", "10000"),
                vec![req_pod("c", &[r("3000", "5000")], &[])],
            ),
            vec![50, 25],
        ),
        (
            "least: zero node resources",
            least.clone(),
            req_pod("p", &[], &[]),
            two_nodes(
                json!({}),
                vec![req_pod("a", &[r("3000", "0")], &[])],
                json!({}),
                vec![],
            ),
            vec![0, 0],
        ),
        // most_allocated_test.go.
        (
            "most: nothing scheduled, nothing requested",
            most.clone(),
            req_pod("p", &[], &[]),
            two_nodes(r("4000", "10000"), vec![], r("4000", "10000"), vec![]),
            vec![0, 0],
        ),
        (
            "most: nothing scheduled, differently sized nodes",
            most.clone(),
            req_pod("p", &[r("1000", "2000"), r("2000", "3000")], &[]),
            two_nodes(r("4000", "10000"), vec![], r("6000", "10000"), vec![]),
            vec![62, 50],
        ),
        (
            "most: resources requested equal node capacity",
            most.clone(),
            req_pod("p", &[r("2000", "4000"), r("3000", "5000")], &[]),
            two_nodes(r("5000", "10000"), vec![], r("10000", "9000"), vec![]),
            vec![95, 75],
        ),
        (
            "most: weighted memory 2, cpu 1",
            strategy(
                MOST_ALLOCATED,
                json!([{"name": "memory", "weight": 2}, {"name": "cpu", "weight": 1}]),
                None,
            ),
            req_pod("p", &[r("1000", "2000"), r("2000", "3000")], &[]),
            two_nodes(r("4000", "10000"), vec![], r("6000", "10000"), vec![]),
            vec![58, 50],
        ),
        (
            "most: containers without requests count the non-zero defaults",
            most.clone(),
            req_pod("p", &[json!({})], &[]),
            two_nodes(
                r("250m", "1000Mi"),
                vec![
                    req_pod("a", &[json!({})], &[]),
                    req_pod("b", &[json!({})], &[]),
                ],
                r("250m", "1000Mi"),
                vec![],
            ),
            vec![80, 30],
        ),
    ];
    for (name, args, p, nodes, want) in cases {
        let pl = NodeResourcesFit::new(&valid(Some(&args)));
        let snap = snapshot(nodes);
        assert_eq!(
            run_score(Some(&pl), &pl, &p, &snap),
            Some(want.clone()),
            "{name}"
        );
        assert_eq!(
            run_score(None, &pl, &p, &snap),
            Some(want),
            "{name}: without PreScore"
        );
    }
}

#[test]
fn requested_to_capacity_ratio_on_an_extended_resource() {
    // TestResourceBinPackingSingleExtended.
    let args = strategy(
        REQUESTED_TO_CAPACITY_RATIO,
        json!([{"name": "intel.com/foo", "weight": 1}]),
        Some(json!([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 1}])),
    );
    let nodes = |p2: Vec<Pod>| {
        vec![
            cap_node(
                "node1",
                json!({"cpu": "4000", "memory": "10000Mi", "intel.com/foo": "8"}),
                vec![],
            ),
            cap_node(
                "node2",
                json!({"cpu": "4000", "memory": "10000Mi", "intel.com/foo": "4"}),
                p2,
            ),
        ]
    };
    let foo = |n: &str| json!({"intel.com/foo": n});
    let cases = [
        (
            "nothing requested: resource left out, all zero",
            req_pod("p", &[], &[]),
            nodes(vec![]),
            vec![0, 0],
        ),
        (
            "2 of 8 and 2 of 4",
            req_pod("p", &[foo("2")], &[]),
            nodes(vec![]),
            vec![2, 5],
        ),
        (
            "2 of 8, and 2+2 of 4",
            req_pod("p", &[foo("2")], &[]),
            nodes(vec![req_pod("e", &[foo("2")], &[])]),
            vec![2, 10],
        ),
        (
            "4 of 8 and 4 of 4",
            req_pod("p", &[foo("4")], &[]),
            nodes(vec![]),
            vec![5, 10],
        ),
    ];
    let pl = NodeResourcesFit::new(&valid(Some(&args)));
    for (name, p, nodes, want) in cases {
        assert_eq!(
            run_score(Some(&pl), &pl, &p, &snapshot(nodes)),
            Some(want),
            "{name}"
        );
    }
}

#[test]
fn broken_linear_function() {
    // TestBrokenLinearFunction.
    let shape = [(10, 1), (90, 9)];
    for (p, want) in [
        (-10, 1),
        (0, 1),
        (9, 1),
        (10, 1),
        (15, 1),
        (19, 1),
        (20, 2),
        (89, 8),
        (90, 9),
        (99, 9),
        (100, 9),
        (110, 9),
    ] {
        assert_eq!(broken_linear(&shape, p), want, "p={p}");
    }
    let shape = [(0, 2), (40, 10), (100, 0)];
    for (p, want) in [
        (-10, 2),
        (0, 2),
        (20, 6),
        (30, 8),
        (40, 10),
        (70, 5),
        (100, 0),
        (110, 0),
    ] {
        assert_eq!(broken_linear(&shape, p), want, "p={p}");
    }
}

#[test]
fn args_default_and_errors_name_the_field() {
    let fit = |args: Value| NodeResourcesFit::new(&valid(Some(&args)));
    let pl = NodeResourcesFit::new(&valid(None));
    assert_eq!(pl.strategy, Strategy::LeastAllocated);
    assert_eq!(pl.scorer.len(), 2);
    let pl = fit(json!({"scoringStrategy": {"type": "MostAllocated"}}));
    assert_eq!(pl.strategy, Strategy::MostAllocated);
    assert_eq!(
        (pl.scorer.len(), pl.scorer.weight(0), pl.scorer.weight(1)),
        (2, 1, 1)
    );
    let pl = fit(json!({"scoringStrategy": {"type": "LeastAllocated",
        "resources": [{"name": "cpu"}, {"name": "example.com/gpu", "weight": 5}]}}));
    assert_eq!((pl.scorer.weight(0), pl.scorer.weight(1)), (1, 5));

    let cases = [
        ("unknown field", json!({"ignoredResource": []}), "NodeResourcesFitArgs.ignoredResource: unknown field `ignoredResource`"),
        ("invalid ignored resource", json!({"ignoredResources": ["a/b/c"]}), "NodeResourcesFitArgs.ignoredResources[0]"),
        (
            "group with a slash",
            json!({"ignoredResourceGroups": ["example.com/aaa"]}),
            "NodeResourcesFitArgs.ignoredResourceGroups[0]: Invalid value: \"example.com/aaa\": resource group name can't contain '/'",
        ),
        (
            "unknown strategy",
            json!({"scoringStrategy": {"type": "Random"}}),
            "NodeResourcesFitArgs.scoringStrategy.type: unknown variant `Random`, expected one of `LeastAllocated`, `MostAllocated`, `RequestedToCapacityRatio`",
        ),
        (
            "strategy without a type",
            json!({"scoringStrategy": {"resources": [{"name": "cpu", "weight": 1}]}}),
            "NodeResourcesFitArgs.scoringStrategy.type: Unsupported value: \"\"",
        ),
        (
            "weight out of range",
            json!({"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "memory", "weight": -1}]}}),
            "NodeResourcesFitArgs.scoringStrategy.resources[0].weight: Invalid value: -1",
        ),
        (
            "weight over 100",
            json!({"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "memory", "weight": 101}]}}),
            "NodeResourcesFitArgs.scoringStrategy.resources[0].weight: Invalid value: 101",
        ),
        (
            "RequestedToCapacityRatio without a shape",
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio"}}),
            "NodeResourcesFitArgs.scoringStrategy.requestedToCapacityRatio: Required value",
        ),
        (
            "empty shape",
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": []}}}),
            "NodeResourcesFitArgs.scoringStrategy.requestedToCapacityRatio.shape: Required value",
        ),
        (
            "unsorted shape",
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": [
                {"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]}}}),
            "NodeResourcesFitArgs.scoringStrategy.requestedToCapacityRatio.shape[1].utilization: Invalid value: 10: values must be sorted",
        ),
        (
            "shape score out of range",
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": [
                {"utilization": 50, "score": 11}]}}}),
            "NodeResourcesFitArgs.scoringStrategy.requestedToCapacityRatio.shape[0].score: Invalid value: 11",
        ),
    ];
    for (name, args, want) in cases {
        let err =
            decode::<NodeResourcesFitArgs>(Some(&args), NodeResourcesFitArgs::KIND).unwrap_err();
        assert!(err.starts_with(want), "{name}: {err}");
    }
}

#[test]
fn resource_name_classes() {
    for (name, extended, scalar) in [
        ("cpu", false, false),
        ("pods", false, false),
        ("example.com/aaa", true, true),
        ("kubernetes.io/something", false, true),
        ("subdomain.kubernetes.io/something", false, true),
        ("hugepages-2Mi", false, true),
        ("attachable-volumes-aws-ebs", false, true),
        ("requests.example.com/x", false, false),
        ("example.com/a b", false, false),
    ] {
        assert_eq!(is_extended_resource_name(name), extended, "{name} extended");
        assert_eq!(is_scalar_resource_name(name), scalar, "{name} scalar");
    }
}
