//! Table tests for PodTopologySpread: cases and expectations follow upstream v1.34's
//! `podtopologyspread/filtering_test.go` and `scoring_test.go`.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use serde_json::{json, Value};

use super::*;
use crate::scheduler::framework::{Code, StaticObjects};
use crate::scheduler::plugin_args::{decode, valid};

fn node(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

/// `(name, labels)` nodes with `hostname`/`zone` shorthand: "zone1/node-a" is zone=zone1 and
/// node=node-a; a bare "node-a" only has the key given by `key`.
fn zoned(specs: &[(&str, &str)]) -> Vec<Node> {
    specs
        .iter()
        .map(|(name, zone)| node(name, json!({"zone": zone, "node": name})))
        .collect()
}

fn pod_json(name: &str, v: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "namespace": "default"},
        "spec": {"containers": [{"name": "c"}]}
    });
    json_patch::merge(&mut p, &v);
    serde_json::from_value(p).unwrap()
}

/// An existing Pod on `node` with label foo="".
fn foo_on(name: &str, node: &str) -> Pod {
    pod_json(
        name,
        json!({"metadata": {"labels": {"foo": ""}}, "spec": {"nodeName": node}}),
    )
}

/// `count` foo Pods on each node, in order.
fn spread(nodes: &[(&str, usize)]) -> Vec<Pod> {
    nodes
        .iter()
        .flat_map(|(n, c)| (0..*c).map(move |i| foo_on(&format!("p-{n}-{i}"), n)))
        .collect()
}

fn snapshot(nodes: Vec<Node>, pods: Vec<Pod>) -> Snapshot {
    let mut infos: Vec<NodeInfo> = nodes
        .into_iter()
        .map(|n| NodeInfo::new(Arc::new(n)))
        .collect();
    for p in pods {
        let target = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        if let Some(n) = infos.iter_mut().find(|n| n.name() == target) {
            n.add_pod(PodInfo::new(Arc::new(p)));
        }
    }
    Snapshot::new(infos, HashMap::new())
}

fn constraint(max_skew: i32, key: &str, when: &str, selector: Value) -> Value {
    json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": selector})
}

fn exists(key: &str) -> Value {
    json!({"matchExpressions": [{"key": key, "operator": "Exists"}]})
}

/// The incoming Pod "p" with these labels, constraints and extra spec.
fn incoming(labels: Value, constraints: Vec<Value>, extra_spec: Value) -> Pod {
    let mut spec = json!({"topologySpreadConstraints": constraints});
    json_patch::merge(&mut spec, &extra_spec);
    pod_json("p", json!({"metadata": {"labels": labels}, "spec": spec}))
}

fn plugin_with(args: Option<Value>, objects: StaticObjects) -> PodTopologySpread {
    PodTopologySpread::new(valid(args.as_ref()), Arc::new(objects))
}

fn plugin() -> PodTopologySpread {
    plugin_with(None, StaticObjects::default())
}

fn codes(pl: &PodTopologySpread, pod: &Pod, snap: &Snapshot) -> Vec<Code> {
    let mut state = CycleState::new();
    let (_, st) = pl.pre_filter(&mut state, pod, snap);
    if st.is_skip() {
        return snap.nodes.iter().map(|_| Code::Success).collect();
    }
    assert!(st.is_success(), "prefilter: {st}");
    snap.nodes
        .iter()
        .map(|n| {
            let s = pl.filter(&state, pod, n);
            if s.code == Code::Unschedulable {
                assert_eq!(s.reasons, vec![ERR_REASON_CONSTRAINTS_NOT_MATCH]);
            }
            if s.code == Code::UnschedulableAndUnresolvable {
                assert_eq!(s.reasons, vec![ERR_REASON_NODE_LABEL_NOT_MATCH]);
            }
            s.code
        })
        .collect()
}

use Code::{Success as S, Unschedulable as U, UnschedulableAndUnresolvable as UU};

fn four_nodes() -> Vec<Node> {
    zoned(&[
        ("node-a", "zone1"),
        ("node-b", "zone1"),
        ("node-x", "zone2"),
        ("node-y", "zone2"),
    ])
}

#[test]
fn filter_single_constraint_upstream_table() {
    let foo = json!({"foo": ""});
    let zone1 = || constraint(1, "zone", "DoNotSchedule", exists("foo"));
    let by_node = |skew| constraint(skew, "node", "DoNotSchedule", exists("foo"));
    type Case<'a> = (&'a str, Pod, Vec<Node>, Vec<Pod>, Vec<Code>);
    let cases: Vec<Case> = vec![
        (
            "no existing pods",
            incoming(foo.clone(), vec![zone1()], json!({})),
            four_nodes(),
            vec![],
            vec![S, S, S, S],
        ),
        (
            "no existing pods, incoming pod doesn't match itself",
            incoming(
                foo.clone(),
                vec![constraint(1, "zone", "DoNotSchedule", exists("bar"))],
                json!({}),
            ),
            four_nodes(),
            vec![],
            vec![S, S, S, S],
        ),
        (
            "existing pods in a different namespace do not count",
            incoming(foo.clone(), vec![zone1()], json!({})),
            four_nodes(),
            vec![
                pod_json(
                    "p-a1",
                    json!({"metadata": {"namespace": "ns1", "labels": foo}, "spec": {"nodeName": "node-a"}}),
                ),
                pod_json(
                    "p-b1",
                    json!({"metadata": {"namespace": "ns2", "labels": foo}, "spec": {"nodeName": "node-a"}}),
                ),
                foo_on("p-x1", "node-x"),
                foo_on("p-y1", "node-y"),
            ],
            vec![S, S, U, U],
        ),
        (
            "pods spread across zones as 3/3, all nodes fit",
            incoming(foo.clone(), vec![zone1()], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            vec![S, S, S, S],
        ),
        (
            "pods spread across zones as 1/2 due to absence of label 'zone' on node-b",
            incoming(foo.clone(), vec![zone1()], json!({})),
            vec![
                node("node-a", json!({"zone": "zone1", "node": "node-a"})),
                node("node-b", json!({"zon": "zone1", "node": "node-b"})),
                node("node-x", json!({"zone": "zone2", "node": "node-x"})),
                node("node-y", json!({"zone": "zone2", "node": "node-y"})),
            ],
            spread(&[("node-a", 1), ("node-b", 1), ("node-x", 1), ("node-y", 1)]),
            vec![S, UU, U, U],
        ),
        (
            "pod cannot be scheduled as all nodes don't have label 'rack'",
            incoming(
                foo.clone(),
                vec![constraint(1, "rack", "DoNotSchedule", exists("foo"))],
                json!({}),
            ),
            zoned(&[("node-a", "zone1"), ("node-x", "zone2")]),
            vec![],
            vec![UU, UU],
        ),
        (
            "pods spread across nodes as 2/1/0/3, only node-x fits",
            incoming(foo.clone(), vec![by_node(1)], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            vec![U, U, S, U],
        ),
        (
            "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit",
            incoming(foo.clone(), vec![by_node(2)], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            vec![U, S, S, U],
        ),
        (
            "pods spread across nodes as 2/1/0/3, but pod doesn't match itself",
            incoming(json!({"bar": ""}), vec![by_node(1)], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            vec![U, S, S, U],
        ),
        (
            "incoming pod has nodeAffinity, pods spread as 2/~1~/~0~/3, hence node-a fits",
            incoming(
                foo.clone(),
                vec![by_node(1)],
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "node", "operator": "In", "values": ["node-a", "node-y"]}]}]
                }}}}),
            ),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            // node-b and node-x only pass because NodeAffinity's own Filter is not run here.
            vec![S, S, S, U],
        ),
        (
            "terminating Pods should be excluded",
            incoming(foo.clone(), vec![by_node(1)], json!({})),
            vec![
                node("node-a", json!({"node": "node-a"})),
                node("node-b", json!({"node": "node-b"})),
            ],
            vec![
                pod_json(
                    "p-a",
                    json!({"metadata": {"labels": foo, "deletionTimestamp": "2024-01-01T00:00:00Z"}, "spec": {"nodeName": "node-a"}}),
                ),
                foo_on("p-b", "node-b"),
            ],
            vec![S, U],
        ),
        (
            "two constraints on zone and node, spreads = [3/3, 2/1/0/3]: only node-x",
            incoming(foo.clone(), vec![zone1(), by_node(1)], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
            vec![U, U, S, U],
        ),
        (
            "two constraints on zone and node, spreads = [3/4, 2/1/0/4]: zone2 is too full",
            incoming(foo.clone(), vec![zone1(), by_node(1)], json!({})),
            four_nodes(),
            spread(&[("node-a", 2), ("node-b", 1), ("node-y", 4)]),
            vec![U, U, U, U],
        ),
        (
            "minDomains 3 with 2 domains: the global minimum is 0",
            incoming(
                foo.clone(),
                vec![{
                    let mut c = zone1();
                    c["minDomains"] = json!(3);
                    c
                }],
                json!({}),
            ),
            four_nodes(),
            spread(&[("node-a", 1), ("node-x", 1)]),
            vec![U, U, U, U],
        ),
        (
            "minDomains 2 with 2 domains: the real minimum",
            incoming(
                foo.clone(),
                vec![{
                    let mut c = zone1();
                    c["minDomains"] = json!(2);
                    c
                }],
                json!({}),
            ),
            four_nodes(),
            spread(&[("node-a", 1), ("node-x", 1)]),
            vec![S, S, S, S],
        ),
    ];
    let pl = plugin();
    for (name, pod, nodes, pods, want) in cases {
        let snap = snapshot(nodes, pods);
        assert_eq!(codes(&pl, &pod, &snap), want, "{name}");
    }
}

#[test]
fn filter_node_inclusion_policies_and_match_label_keys() {
    let foo = json!({"foo": ""});
    let tainted = || {
        let mut n = node("node-a", json!({"node": "node-a"}));
        n.spec = Some(
            serde_json::from_value(
                json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}),
            )
            .unwrap(),
        );
        n
    };
    let nodes = || vec![tainted(), node("node-b", json!({"node": "node-b"}))];
    let with_policy = |affinity: Option<&str>, taints: Option<&str>| {
        let mut c = constraint(1, "node", "DoNotSchedule", exists("foo"));
        if let Some(a) = affinity {
            c["nodeAffinityPolicy"] = json!(a);
        }
        if let Some(t) = taints {
            c["nodeTaintsPolicy"] = json!(t);
        }
        c
    };
    let pl = plugin();
    let pods = || spread(&[("node-b", 1)]);
    // Taints ignored by default: the tainted empty node-a is the minimum (0), node-b is 1 over.
    let snap = snapshot(nodes(), pods());
    assert_eq!(
        codes(
            &pl,
            &incoming(foo.clone(), vec![with_policy(None, None)], json!({})),
            &snap
        ),
        vec![S, U]
    );
    // nodeTaintsPolicy Honor: node-a is not a domain, node-b's count is the minimum.
    assert_eq!(
        codes(
            &pl,
            &incoming(
                foo.clone(),
                vec![with_policy(None, Some("Honor"))],
                json!({})
            ),
            &snap
        ),
        vec![S, S],
        "nodeTaintsPolicy Honor"
    );
    // ...unless the Pod tolerates the taint.
    let tolerating = json!({"tolerations": [{"key": "k", "operator": "Exists"}]});
    assert_eq!(
        codes(
            &pl,
            &incoming(
                foo.clone(),
                vec![with_policy(None, Some("Honor"))],
                tolerating
            ),
            &snap
        ),
        vec![S, U],
        "tolerated taint counts"
    );
    // nodeAffinityPolicy Ignore: a node outside the Pod's nodeSelector still counts.
    let selector = json!({"nodeSelector": {"node": "node-b"}});
    assert_eq!(
        codes(
            &pl,
            &incoming(foo.clone(), vec![with_policy(None, None)], selector.clone()),
            &snap
        ),
        vec![S, S],
        "nodeAffinityPolicy Honor (default) drops node-a"
    );
    assert_eq!(
        codes(
            &pl,
            &incoming(
                foo.clone(),
                vec![with_policy(Some("Ignore"), None)],
                selector
            ),
            &snap
        ),
        vec![S, U],
        "nodeAffinityPolicy Ignore keeps node-a"
    );

    // matchLabelKeys: only Pods with the incoming Pod's app-rev count.
    let snap = snapshot(
        vec![
            node("node-a", json!({"node": "node-a"})),
            node("node-b", json!({"node": "node-b"})),
        ],
        vec![
            pod_json(
                "old1",
                json!({"metadata": {"labels": {"foo": "", "rev": "v1"}}, "spec": {"nodeName": "node-a"}}),
            ),
            pod_json(
                "old2",
                json!({"metadata": {"labels": {"foo": "", "rev": "v1"}}, "spec": {"nodeName": "node-a"}}),
            ),
        ],
    );
    let labels = json!({"foo": "", "rev": "v2"});
    let plain = constraint(1, "node", "DoNotSchedule", exists("foo"));
    assert_eq!(
        codes(
            &pl,
            &incoming(labels.clone(), vec![plain.clone()], json!({})),
            &snap
        ),
        vec![U, S]
    );
    let mut keyed = plain;
    keyed["matchLabelKeys"] = json!(["rev"]);
    assert_eq!(
        codes(&pl, &incoming(labels, vec![keyed], json!({})), &snap),
        vec![S, S],
        "matchLabelKeys"
    );
}

#[test]
fn add_and_remove_pod_move_the_critical_paths() {
    // 2/1/0/3 by node: node-y is 3 + 1 - 0 over. Removing its three Pods (preemption's victims)
    // makes it fit; adding one back makes it 1 + 1 - 0 = 2 > 1 again.
    let pl = plugin();
    let snap = snapshot(
        four_nodes(),
        spread(&[("node-a", 2), ("node-b", 1), ("node-y", 3)]),
    );
    let pod = incoming(
        json!({"foo": ""}),
        vec![constraint(1, "node", "DoNotSchedule", exists("foo"))],
        json!({}),
    );
    let mut state = CycleState::new();
    assert!(pl.pre_filter(&mut state, &pod, &snap).1.is_success());
    let y = &snap.nodes[3];
    assert_eq!(pl.filter(&state, &pod, y).code, Code::Unschedulable);
    let mut sim = state.clone();
    for victim in y.pods.clone() {
        assert!(pl.remove_pod(&mut sim, &pod, &victim, y).is_success());
    }
    assert!(pl.filter(&sim, &pod, y).is_success());
    // The cycle's own state did not change.
    assert_eq!(pl.filter(&state, &pod, y).code, Code::Unschedulable);
    pl.add_pod(&mut sim, &pod, &y.pods[0], y);
    assert_eq!(pl.filter(&sim, &pod, y).code, Code::Unschedulable);
    // A Pod of another namespace changes nothing.
    let other = PodInfo::new(Arc::new(pod_json(
        "o",
        json!({"metadata": {"namespace": "other", "labels": {"foo": ""}}}),
    )));
    let mut sim = state.clone();
    pl.remove_pod(&mut sim, &pod, &other, y);
    assert_eq!(pl.filter(&sim, &pod, y).code, Code::Unschedulable);
}

/// PreScore over `feasible` node names, Score, NormalizeScore: the normalized scores of the
/// feasible nodes (None when PreScore skips).
fn scores(
    pl: &PodTopologySpread,
    pod: &Pod,
    snap: &Snapshot,
    feasible: &[&str],
) -> Option<Vec<i64>> {
    let nodes: Vec<Arc<NodeInfo>> = feasible
        .iter()
        .map(|n| snap.get(n).unwrap().clone())
        .collect();
    let mut state = CycleState::new();
    let st = pl.pre_score(&mut state, pod, &nodes, snap);
    if st.is_skip() {
        return None;
    }
    assert!(st.is_success(), "prescore: {st}");
    let mut list: Vec<NodeScore> = nodes
        .iter()
        .map(|n| NodeScore {
            name: n.name().to_string(),
            score: pl.score(&state, pod, n).unwrap(),
        })
        .collect();
    assert!(pl.normalize(&state, pod, &mut list).is_success());
    Some(list.into_iter().map(|s| s.score).collect())
}

const HOST: &str = "kubernetes.io/hostname";

fn hosts(names: &[&str]) -> Vec<Node> {
    names.iter().map(|n| node(n, json!({HOST: n}))).collect()
}

#[test]
fn score_upstream_table() {
    let foo = json!({"foo": ""});
    let soft = |skew, key: &str| constraint(skew, key, "ScheduleAnyway", exists("foo"));
    type Case<'a> = (
        &'a str,
        Pod,
        Vec<Node>,
        Vec<Pod>,
        Vec<&'a str>,
        Option<Vec<i64>>,
    );
    let cases: Vec<Case> = vec![
        (
            "one constraint on node, no existing pods",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            hosts(&["node-a", "node-b"]),
            vec![],
            vec!["node-a", "node-b"],
            Some(vec![100, 100]),
        ),
        (
            "one constraint on node, only one node is candidate",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            hosts(&["node-a", "node-b"]),
            spread(&[("node-a", 2), ("node-b", 1)]),
            vec!["node-a"],
            Some(vec![100]),
        ),
        (
            "one constraint on node, all nodes have the same number of matching pods",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            hosts(&["node-a", "node-b"]),
            spread(&[("node-a", 1), ("node-b", 1)]),
            vec!["node-a", "node-b"],
            Some(vec![100, 100]),
        ),
        (
            "one constraint on node, all 4 nodes are candidates (2/1/0/3)",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            hosts(&["node-a", "node-b", "node-c", "node-d"]),
            spread(&[("node-a", 2), ("node-b", 1), ("node-d", 3)]),
            vec!["node-a", "node-b", "node-c", "node-d"],
            Some(vec![20, 60, 100, 0]),
        ),
        (
            "one constraint on node, null selector",
            incoming(
                foo.clone(),
                vec![
                    json!({"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "ScheduleAnyway"}),
                ],
                json!({}),
            ),
            hosts(&["node-a", "node-b", "node-c", "node-d"]),
            spread(&[("node-a", 2), ("node-b", 1), ("node-d", 3)]),
            vec!["node-a", "node-b", "node-c", "node-d"],
            Some(vec![100, 100, 100, 100]),
        ),
        (
            "one constraint on node, maxSkew=2",
            incoming(foo.clone(), vec![soft(2, HOST)], json!({})),
            hosts(&["node-a", "node-b", "node-c", "node-d"]),
            spread(&[("node-a", 2), ("node-b", 1), ("node-d", 3)]),
            vec!["node-a", "node-b", "node-c", "node-d"],
            Some(vec![33, 66, 100, 16]),
        ),
        (
            "one constraint on node, maxSkew=3 (4/3/2/1)",
            incoming(foo.clone(), vec![soft(3, HOST)], json!({})),
            hosts(&["node-a", "node-b", "node-c", "node-d"]),
            spread(&[("node-a", 4), ("node-b", 3), ("node-c", 2), ("node-d", 1)]),
            vec!["node-a", "node-b", "node-c", "node-d"],
            Some(vec![44, 66, 77, 100]),
        ),
        (
            "one constraint on node, 3 out of 4 nodes are candidates (4/2/1/~3~)",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            hosts(&["node-a", "node-b", "node-x", "node-y"]),
            spread(&[("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)]),
            vec!["node-a", "node-b", "node-x"],
            Some(vec![33, 83, 100]),
        ),
        (
            "one constraint on node, one candidate without the topology key (4/?2?/1/~3~)",
            incoming(foo.clone(), vec![soft(1, HOST)], json!({})),
            vec![
                node("node-a", json!({HOST: "node-a"})),
                node("node-b", json!({"n": "node-b"})),
                node("node-x", json!({HOST: "node-x"})),
                node("node-y", json!({HOST: "node-y"})),
            ],
            spread(&[("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)]),
            vec!["node-a", "node-b", "node-x"],
            Some(vec![16, 0, 100]),
        ),
        (
            "one constraint on zone, 3 out of 4 nodes are candidates",
            incoming(foo.clone(), vec![soft(1, "zone")], json!({})),
            zoned(&[
                ("node-a", "zone1"),
                ("node-b", "zone1"),
                ("node-x", "zone2"),
                ("node-y", "zone2"),
            ]),
            spread(&[("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)]),
            vec!["node-a", "node-b", "node-x"],
            Some(vec![75, 75, 100]),
        ),
        (
            "no ScheduleAnyway constraint: PreScore skips",
            incoming(
                foo.clone(),
                vec![constraint(1, HOST, "DoNotSchedule", exists("foo"))],
                json!({}),
            ),
            hosts(&["node-a"]),
            vec![],
            vec!["node-a"],
            None,
        ),
    ];
    let pl = plugin();
    for (name, pod, nodes, pods, feasible, want) in cases {
        let snap = snapshot(nodes, pods);
        assert_eq!(scores(&pl, &pod, &snap, &feasible), want, "{name}");
    }
}

#[test]
fn system_default_constraints_select_by_service_and_owner() {
    let nodes = || hosts(&["node-a", "node-b", "node-c", "node-d"]);
    let all = ["node-a", "node-b", "node-c", "node-d"];
    let pods = || spread(&[("node-a", 4), ("node-b", 3), ("node-c", 2), ("node-d", 1)]);
    let bare = pod_json("p", json!({"metadata": {"labels": {"foo": ""}}}));

    // No Service or owner selects the Pod: nothing to spread by.
    let pl = plugin();
    let snap = snapshot(nodes(), pods());
    assert_eq!(scores(&pl, &bare, &snap, &all), None, "no default selector");
    let mut state = CycleState::new();
    assert!(
        pl.pre_filter(&mut state, &bare, &snap).1.is_skip(),
        "system defaults are soft"
    );

    // A Service selecting foo: hostname maxSkew 3 as the only effective constraint (nodes have no
    // zone; system defaulting does not require every key).
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {"selector": {"foo": ""}}})).unwrap();
    let pl = plugin_with(
        None,
        StaticObjects {
            services: vec![Arc::new(svc)],
            ..Default::default()
        },
    );
    assert_eq!(
        scores(&pl, &bare, &snap, &all),
        Some(vec![44, 66, 77, 100]),
        "service selector"
    );

    // A Service in another namespace does not select it.
    let other: Service = serde_json::from_value(
        json!({"metadata": {"name": "s", "namespace": "other"}, "spec": {"selector": {"foo": ""}}}),
    )
    .unwrap();
    let pl = plugin_with(
        None,
        StaticObjects {
            services: vec![Arc::new(other)],
            ..Default::default()
        },
    );
    assert_eq!(scores(&pl, &bare, &snap, &all), None, "other namespace");

    // Owned by a ReplicaSet selecting app=web: only its Pods count (3 on node-d).
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {}}
    }))
    .unwrap();
    let owned = pod_json(
        "p",
        json!({"metadata": {"labels": {"app": "web"}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": true}
        ]}}),
    );
    let mut pods = pods();
    for i in 0..3 {
        pods.push(pod_json(
            &format!("web-{i}"),
            json!({"metadata": {"labels": {"app": "web"}}, "spec": {"nodeName": "node-d"}}),
        ));
    }
    let snap = snapshot(nodes(), pods);
    let pl = plugin_with(
        None,
        StaticObjects {
            replica_sets: vec![Arc::new(rs)],
            ..Default::default()
        },
    );
    // 0/0/0/3 with maxSkew 3, weight ln(6): raw 2,2,2,7 -> 100,100,100,28.
    assert_eq!(
        scores(&pl, &owned, &snap, &all),
        Some(vec![100, 100, 100, 28]),
        "replicaset selector"
    );

    // List defaulting with a DoNotSchedule default constraint filters by the deduced selector.
    let args = json!({"defaultingType": "List", "defaultConstraints": [
        {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule"}
    ]});
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {}}
    }))
    .unwrap();
    let pl = plugin_with(
        Some(args),
        StaticObjects {
            replica_sets: vec![Arc::new(rs)],
            ..Default::default()
        },
    );
    assert_eq!(
        codes(&pl, &owned, &snap),
        vec![S, S, S, U],
        "list defaulting filters"
    );
    assert_eq!(
        scores(&pl, &owned, &snap, &all),
        None,
        "no soft default constraint"
    );
}

#[test]
fn args_are_validated_naming_the_field() {
    let objects: Arc<dyn ClusterObjects> = Arc::new(StaticObjects::default());
    let c = |v: Value| json!({"defaultingType": "List", "defaultConstraints": [v]});
    for (args, field) in [
        (json!({"defaultingType": "Bogus"}), "defaultingType"),
        (
            json!({"defaultConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]}),
            "defaultingType",
        ),
        (
            c(json!({"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"})),
            "defaultConstraints[0].maxSkew",
        ),
        (
            c(json!({"maxSkew": 1, "topologyKey": "", "whenUnsatisfiable": "ScheduleAnyway"})),
            "defaultConstraints[0].topologyKey",
        ),
        (
            c(json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"})),
            "defaultConstraints[0].whenUnsatisfiable",
        ),
        (
            c(
                json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {}}),
            ),
            "defaultConstraints[0].labelSelector",
        ),
        (
            json!({"defaultingType": "List", "defaultConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"},
                {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]}),
            "defaultConstraints[1]",
        ),
        (json!({"unknown": true}), "unknown"),
    ] {
        let e = decode::<PodTopologySpreadArgs>(Some(&args), "args").unwrap_err();
        assert!(e.contains(field), "{args}: {e}");
    }
    // List defaulting without constraints: no defaults at all.
    let pl = PodTopologySpread::new(valid(Some(&json!({"defaultingType": "List"}))), objects);
    assert!(pl.default_constraints.is_empty());
    assert!(!pl.system_defaulted);
}

#[test]
fn counts_remembered_across_cycles_follow_changed_nodes() {
    // One plugin over three snapshots that share unchanged node objects, as the scheduler
    // cache's snapshots do: only the changed node is recounted, and never from a stale count.
    let pl = plugin();
    let pod = incoming(
        json!({"foo": ""}),
        vec![constraint(1, "node", "DoNotSchedule", exists("foo"))],
        json!({}),
    );
    let info = |name: &str, pods: usize| {
        let mut n = NodeInfo::new(Arc::new(node(name, json!({"node": name}))));
        for p in spread(&[(name, pods)]) {
            n.add_pod(PodInfo::new(Arc::new(p)));
        }
        Arc::new(n)
    };
    let (a1, b0) = (info("node-a", 1), info("node-b", 0));
    let snap = Snapshot::from_arcs(vec![a1.clone(), b0.clone()], HashMap::new());
    assert_eq!(codes(&pl, &pod, &snap), vec![U, S]);
    let a0 = info("node-a", 0);
    let snap = Snapshot::from_arcs(vec![a0.clone(), b0], HashMap::new());
    assert_eq!(codes(&pl, &pod, &snap), vec![S, S], "node-a changed");
    let b2 = info("node-b", 2);
    let snap = Snapshot::from_arcs(vec![a0.clone(), b2.clone()], HashMap::new());
    assert_eq!(codes(&pl, &pod, &snap), vec![S, U], "node-b changed");
    // Nodes in another order (a node added in front): positions move, counts stay right.
    let c3 = info("node-c", 3);
    let snap = Snapshot::from_arcs(vec![c3, b2, a0], HashMap::new());
    assert_eq!(codes(&pl, &pod, &snap), vec![U, U, S], "reordered");
    // The same through PreScore's soft constraint.
    let soft = incoming(
        json!({"foo": ""}),
        vec![constraint(1, "zone", "ScheduleAnyway", exists("foo"))],
        json!({}),
    );
    let zoned_info = |name: &str, zone: &str, pods: usize| {
        let mut n = NodeInfo::new(Arc::new(node(name, json!({"zone": zone}))));
        for p in spread(&[(name, pods)]) {
            n.add_pod(PodInfo::new(Arc::new(p)));
        }
        Arc::new(n)
    };
    let (x, y) = (zoned_info("x", "z1", 2), zoned_info("y", "z2", 0));
    let snap = Snapshot::from_arcs(vec![x.clone(), y], HashMap::new());
    assert_eq!(scores(&pl, &soft, &snap, &["x", "y"]), Some(vec![0, 100]));
    let snap = Snapshot::from_arcs(vec![x, zoned_info("y", "z2", 2)], HashMap::new());
    assert_eq!(scores(&pl, &soft, &snap, &["x", "y"]), Some(vec![100, 100]));
}
