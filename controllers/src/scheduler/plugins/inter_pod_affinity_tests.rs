//! Table tests for InterPodAffinity: cases and expectations follow upstream v1.34's
//! `interpodaffinity/filtering_test.go` and `scoring_test.go`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

use super::*;
use crate::scheduler::framework::Code;
use crate::scheduler::plugin_args::{decode, valid};

fn node(name: &str, labels: Value) -> NodeInfo {
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    NodeInfo::new(Arc::new(n))
}

/// A Pod from `{"ns", "labels", "node", "affinity"}` shorthand.
fn pod(i: usize, v: &Value) -> Pod {
    let mut p = json!({
        "metadata": {
            "name": format!("p{i}"),
            "uid": format!("uid-{i}"),
            "namespace": v.get("ns").cloned().unwrap_or(json!("default")),
            "labels": v.get("labels").cloned().unwrap_or(json!({})),
        },
        "spec": {"containers": [{"name": "c"}]}
    });
    if let Some(n) = v.get("node") {
        p["spec"]["nodeName"] = n.clone();
    }
    if let Some(a) = v.get("affinity") {
        p["spec"]["affinity"] = a.clone();
    }
    serde_json::from_value(p).unwrap()
}

fn snapshot(nodes: Vec<NodeInfo>, pods: &[Value], ns_labels: &[(&str, Value)]) -> Snapshot {
    let mut nodes = nodes;
    for (i, v) in pods.iter().enumerate() {
        let p = pod(100 + i, v);
        let target = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        if let Some(n) = nodes.iter_mut().find(|n| n.name() == target) {
            n.add_pod(PodInfo::new(Arc::new(p)));
        }
    }
    let ns: HashMap<String, BTreeMap<String, String>> = ns_labels
        .iter()
        .map(|(n, l)| (n.to_string(), serde_json::from_value(l.clone()).unwrap()))
        .collect();
    Snapshot::new(nodes, ns)
}

fn plugin(args: Option<Value>) -> InterPodAffinity {
    InterPodAffinity::new(valid(args.as_ref()), 1)
}

fn term(key: &str, op: &str, values: &[&str], topology: &str) -> Value {
    let mut e = json!({"key": key, "operator": op});
    if !values.is_empty() {
        e["values"] = json!(values);
    }
    json!({"labelSelector": {"matchExpressions": [e]}, "topologyKey": topology})
}

fn required(affinity: Vec<Value>, anti: Vec<Value>) -> Value {
    json!({
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": affinity},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": anti},
    })
}

fn weighted(weight: i32, t: Value) -> Value {
    json!({"weight": weight, "podAffinityTerm": t})
}

fn preferred(affinity: Vec<Value>, anti: Vec<Value>) -> Value {
    json!({
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": affinity},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": anti},
    })
}

/// A node's Filter outcome: None for success, else (code, reason).
type Rejection = Option<(Code, String)>;

/// Runs PreFilter + Filter on every node.
fn filter_all(pl: &InterPodAffinity, pod: &Pod, snap: &Snapshot) -> Vec<Rejection> {
    let mut state = CycleState::new();
    let (_, st) = pl.pre_filter(&mut state, pod, snap);
    if st.is_skip() {
        return snap.nodes.iter().map(|_| None).collect();
    }
    assert!(st.is_success(), "prefilter: {st}");
    snap.nodes
        .iter()
        .map(|n| {
            let s = pl.filter(&state, pod, n);
            (!s.is_success()).then(|| (s.code, s.reasons.join(", ")))
        })
        .collect()
}

const AFF: &str = ERR_REASON_AFFINITY_RULES_NOT_MATCH;
const ANTI: &str = ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH;
const EXISTING: &str = ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH;

fn unres(r: &str) -> Rejection {
    Some((Code::UnschedulableAndUnresolvable, r.to_string()))
}
fn unsched(r: &str) -> Rejection {
    Some((Code::Unschedulable, r.to_string()))
}

#[test]
fn filter_single_node_matches_upstream_required_affinity_cases() {
    let sec_scan = json!({"service": "securityscan"});
    let s1 = json!({"security": "S1"});
    let in_scan = term("service", "In", &["securityscan", "value2"], "region");
    let cases: Vec<(&str, Value, Vec<Value>, Rejection)> = vec![
        (
            "a pod without affinity fits a node with no Pods",
            json!({}),
            vec![],
            None,
        ),
        (
            "required affinity In matches the existing Pod",
            json!({"labels": s1, "affinity": required(vec![in_scan.clone()], vec![])}),
            vec![json!({"node": "machine1", "labels": sec_scan})],
            None,
        ),
        (
            "required affinity NotIn matches the existing Pod",
            json!({"labels": s1, "affinity": required(vec![term("service", "NotIn", &["securityscan3", "value3"], "region")], vec![])}),
            vec![json!({"node": "machine1", "labels": sec_scan})],
            None,
        ),
        (
            "affinity in another namespace does not match: unresolvable",
            json!({"labels": s1, "affinity": required(vec![{
                let mut t = in_scan.clone();
                t["namespaces"] = json!(["DiffNameSpace"]);
                t
            }], vec![])}),
            vec![json!({"node": "machine1", "labels": sec_scan, "ns": "ns"})],
            unres(AFF),
        ),
        (
            "unmatching labelSelector: unresolvable",
            json!({"labels": sec_scan, "affinity": required(vec![term("service", "In", &["antivirusscan", "value2"], "region")], vec![])}),
            vec![json!({"node": "machine1", "labels": sec_scan})],
            unres(AFF),
        ),
        (
            "affinity and anti-affinity both satisfied",
            json!({"labels": s1, "affinity": required(vec![in_scan.clone()], vec![term("service", "In", &["antivirusscan", "value2"], "node")])}),
            vec![json!({"node": "machine1", "labels": sec_scan})],
            None,
        ),
        (
            "affinity satisfied, own anti-affinity not: unschedulable",
            json!({"labels": s1, "affinity": required(vec![in_scan.clone()], vec![term("service", "In", &["securityscan", "value2"], "zone")])}),
            vec![json!({"node": "machine1", "labels": sec_scan})],
            unsched(ANTI),
        ),
        (
            "existing Pod's anti-affinity (symmetry) rejects the Pod",
            json!({"labels": sec_scan, "affinity": required(vec![in_scan.clone()], vec![term("service", "In", &["antivirusscan", "value2"], "node")])}),
            vec![
                json!({"node": "machine1", "labels": sec_scan, "affinity": required(vec![], vec![term("service", "In", &["securityscan", "value2"], "zone")])}),
            ],
            unsched(EXISTING),
        ),
        (
            "a Pod that does not match its own affinity and no Pod matches: unresolvable",
            json!({"labels": sec_scan, "affinity": required(vec![term("service", "NotIn", &["securityscan", "value2"], "region")], vec![])}),
            vec![json!({"node": "machine2", "labels": sec_scan})],
            unres(AFF),
        ),
        (
            "existing anti-affinity is respected when the Pod has none",
            json!({"labels": sec_scan}),
            vec![
                json!({"node": "machine1", "labels": sec_scan, "affinity": required(vec![], vec![term("service", "In", &["securityscan", "value2"], "zone")])}),
            ],
            unsched(EXISTING),
        ),
        (
            "existing anti-affinity NotIn does not match the Pod",
            json!({"labels": sec_scan}),
            vec![
                json!({"node": "machine1", "labels": sec_scan, "affinity": required(vec![], vec![term("service", "NotIn", &["securityscan", "value2"], "zone")])}),
            ],
            None,
        ),
        (
            "first Pod of a group: matches its own terms and no Pod matches anywhere",
            json!({"labels": sec_scan, "affinity": required(vec![in_scan.clone()], vec![])}),
            vec![],
            None,
        ),
        (
            "first-Pod rule needs the node to have the topology key",
            json!({"labels": sec_scan, "affinity": required(vec![term("service", "In", &["securityscan"], "rack")], vec![])}),
            vec![],
            unres(AFF),
        ),
    ];
    let pl = plugin(None);
    for (name, incoming, pods, want) in cases {
        let snap = snapshot(
            vec![node("machine1", json!({"region": "r1", "zone": "z11"}))],
            &pods,
            &[],
        );
        let got = filter_all(&pl, &pod(0, &incoming), &snap);
        assert_eq!(got, vec![want], "{name}");
    }
}

#[test]
fn filter_multiple_nodes_by_topology() {
    let a = json!({"foo": "bar"});
    let cases: Vec<(&str, Value, Vec<Value>, Vec<Rejection>)> = vec![
        (
            "affinity to a Pod in region r1 allows every node of r1 only",
            json!({"affinity": required(vec![term("foo", "In", &["bar"], "region")], vec![])}),
            vec![json!({"node": "machine1", "labels": a})],
            vec![None, None, unres(AFF)],
        ),
        (
            "anti-affinity by zone: the zone of the matching Pod is excluded",
            json!({"labels": a, "affinity": required(vec![], vec![term("foo", "In", &["bar"], "zone")])}),
            vec![json!({"node": "machine1", "labels": a})],
            vec![unsched(ANTI), None, None],
        ),
        (
            "existing anti-affinity by region excludes the whole region",
            json!({"labels": a}),
            vec![
                json!({"node": "machine1", "affinity": required(vec![], vec![term("foo", "In", &["bar"], "region")])}),
            ],
            vec![unsched(EXISTING), unsched(EXISTING), None],
        ),
        (
            "first Pod of a group may go to every node with the key",
            json!({"labels": a, "affinity": required(vec![term("foo", "In", &["bar"], "zone")], vec![])}),
            vec![],
            vec![None, None, None],
        ),
    ];
    let pl = plugin(None);
    for (name, incoming, pods, want) in cases {
        let snap = snapshot(
            vec![
                node("machine1", json!({"region": "r1", "zone": "z1"})),
                node("machine2", json!({"region": "r1", "zone": "z2"})),
                node("machine3", json!({"region": "r2", "zone": "z3"})),
            ],
            &pods,
            &[],
        );
        let got = filter_all(&pl, &pod(0, &incoming), &snap);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn filter_namespace_selector_resolves_through_namespace_labels() {
    let ns_sel = |labels: Value| {
        let mut t = term("foo", "In", &["bar"], "region");
        t["namespaceSelector"] = json!({"matchLabels": labels});
        t
    };
    let ns = [
        ("team1-a", json!({"team": "team1"})),
        ("team2-a", json!({"team": "team2"})),
    ];
    let cases = vec![
        (
            "namespaceSelector selects the existing Pod's namespace",
            json!({"ns": "team2-a", "affinity": required(vec![ns_sel(json!({"team": "team1"}))], vec![])}),
            vec![None, unres(AFF)],
        ),
        (
            "namespaceSelector selects no namespace with the Pod",
            json!({"ns": "team2-a", "affinity": required(vec![ns_sel(json!({"team": "team3"}))], vec![])}),
            vec![unres(AFF), unres(AFF)],
        ),
        (
            "empty namespaceSelector means every namespace (anti-affinity)",
            json!({"ns": "team2-a", "affinity": required(vec![], vec![{
                let mut t = term("foo", "In", &["bar"], "region");
                t["namespaceSelector"] = json!({});
                t
            }])}),
            vec![unsched(ANTI), None],
        ),
        (
            "existing Pod's anti-affinity selects the incoming Pod's namespace by labels",
            json!({"ns": "team1-a", "labels": {"foo": "bar"}}),
            vec![unsched(EXISTING), None],
        ),
    ];
    let pl = plugin(None);
    for (name, incoming, want) in cases {
        let existing_anti = {
            let mut t = term("foo", "In", &["bar"], "region");
            t["namespaceSelector"] = json!({"matchLabels": {"team": "team1"}});
            t
        };
        let mut pods = vec![json!({"node": "n1", "ns": "team1-a", "labels": {"foo": "bar"}})];
        if name.starts_with("existing") {
            pods = vec![
                json!({"node": "n1", "ns": "team2-a", "affinity": required(vec![], vec![existing_anti])}),
            ];
        }
        let snap = snapshot(
            vec![
                node("n1", json!({"region": "r1"})),
                node("n2", json!({"region": "r2"})),
            ],
            &pods,
            &ns,
        );
        let got = filter_all(&pl, &pod(0, &incoming), &snap);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn add_and_remove_pod_update_prefilter_counts() {
    // The incoming Pod has anti-affinity to foo=bar by zone; the only matching Pod is a victim
    // on n1: removing it makes n1 fit, adding it back rejects n1 again.
    let pl = plugin(None);
    let snap = snapshot(
        vec![
            node("n1", json!({"zone": "z1"})),
            node("n2", json!({"zone": "z2"})),
        ],
        &[json!({"node": "n1", "labels": {"foo": "bar"}})],
        &[],
    );
    let incoming = pod(
        0,
        &json!({"affinity": required(vec![], vec![term("foo", "In", &["bar"], "zone")])}),
    );
    let mut state = CycleState::new();
    assert!(pl.pre_filter(&mut state, &incoming, &snap).1.is_success());
    let n1 = &snap.nodes[0];
    assert_eq!(pl.filter(&state, &incoming, n1).code, Code::Unschedulable);
    let victim = n1.pods[0].clone();
    let mut copy = state.clone();
    assert!(pl
        .remove_pod(&mut copy, &incoming, &victim, n1)
        .is_success());
    assert!(pl.filter(&copy, &incoming, n1).is_success());
    // The original state is untouched by the clone's update.
    assert_eq!(pl.filter(&state, &incoming, n1).code, Code::Unschedulable);
    assert!(pl.add_pod(&mut copy, &incoming, &victim, n1).is_success());
    assert_eq!(pl.filter(&copy, &incoming, n1).code, Code::Unschedulable);

    // Existing anti-affinity: removing the Pod that carries it lifts the rejection.
    let snap = snapshot(
        vec![node("n1", json!({"zone": "z1"}))],
        &[
            json!({"node": "n1", "affinity": required(vec![], vec![term("app", "Exists", &[], "zone")])}),
        ],
        &[],
    );
    let incoming = pod(0, &json!({"labels": {"app": "x"}}));
    let mut state = CycleState::new();
    assert!(pl.pre_filter(&mut state, &incoming, &snap).1.is_success());
    let n1 = &snap.nodes[0];
    assert_eq!(pl.filter(&state, &incoming, n1).reasons, vec![EXISTING]);
    let victim = n1.pods[0].clone();
    pl.remove_pod(&mut state, &incoming, &victim, n1);
    assert!(pl.filter(&state, &incoming, n1).is_success());
}

#[test]
fn prefilter_skips_pods_without_required_terms_and_rejects_invalid_selectors() {
    let pl = plugin(None);
    let snap = snapshot(vec![node("n1", json!({"zone": "z1"}))], &[], &[]);
    let mut state = CycleState::new();
    let (_, st) = pl.pre_filter(&mut state, &pod(0, &json!({})), &snap);
    assert!(st.is_skip());
    let bad = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}, "topologyKey": "zone"}
    ]}}});
    let (_, st) = pl.pre_filter(&mut state, &pod(0, &bad), &snap);
    assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
    assert!(
        st.reasons[0].contains("spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"),
        "{st}"
    );
}

/// PreScore + Score + NormalizeScore over all nodes (every node feasible); None when PreScore
/// skips.
fn scores(pl: &InterPodAffinity, pod: &Pod, snap: &Snapshot) -> Option<Vec<i64>> {
    let mut state = CycleState::new();
    let st = pl.pre_score(&mut state, pod, &snap.nodes, snap);
    if st.is_skip() {
        return None;
    }
    assert!(st.is_success(), "prescore: {st}");
    let mut list: Vec<NodeScore> = snap
        .nodes
        .iter()
        .map(|n| NodeScore {
            name: n.name().to_string(),
            score: pl.score(&state, pod, n).unwrap(),
        })
        .collect();
    assert!(pl.normalize(&state, pod, &mut list).is_success());
    Some(list.into_iter().map(|s| s.score).collect())
}

#[test]
fn score_matches_upstream_preferred_affinity_table() {
    let china = json!({"region": "China"});
    let india = json!({"region": "India"});
    let az1 = json!({"az": "az1"});
    let az2 = json!({"az": "az2"});
    let china_az1 = json!({"region": "China", "az": "az1"});
    let s1 = json!({"security": "S1"});
    let s2 = json!({"security": "S2"});
    let stay_s1_region = preferred(
        vec![weighted(5, term("security", "In", &["S1"], "region"))],
        vec![],
    );
    let stay_s2_region = preferred(
        vec![weighted(6, term("security", "In", &["S2"], "region"))],
        vec![],
    );
    let affinity3 = preferred(
        vec![
            weighted(
                8,
                json!({"labelSelector": {"matchExpressions": [
                {"key": "security", "operator": "NotIn", "values": ["S1"]},
                {"key": "security", "operator": "In", "values": ["S2"]}]}, "topologyKey": "region"}),
            ),
            weighted(
                2,
                json!({"labelSelector": {"matchExpressions": [
                {"key": "security", "operator": "Exists"},
                {"key": "wrongkey", "operator": "DoesNotExist"}]}, "topologyKey": "region"}),
            ),
        ],
        vec![],
    );
    let hard = required(
        vec![
            term("security", "In", &["S1", "value2"], "region"),
            json!({"labelSelector": {"matchExpressions": [
                {"key": "security", "operator": "Exists"},
                {"key": "wrongkey", "operator": "DoesNotExist"}]}, "topologyKey": "region"}),
        ],
        vec![],
    );
    let away_s1_az = preferred(
        vec![],
        vec![weighted(5, term("security", "In", &["S1"], "az"))],
    );
    let away_s2_az = preferred(
        vec![],
        vec![weighted(5, term("security", "In", &["S2"], "az"))],
    );
    let stay_s1_away_s2 = preferred(
        vec![weighted(8, term("security", "In", &["S1"], "region"))],
        vec![weighted(5, term("security", "In", &["S2"], "az"))],
    );
    type Case<'a> = (
        &'a str,
        Value,
        Vec<Value>,
        Vec<(&'a str, Value)>,
        Option<Vec<i64>>,
    );
    let cases: Vec<Case> = vec![
        (
            "no affinity anywhere: PreScore skips",
            json!({"labels": s1}),
            vec![],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", az1.clone()),
            ],
            None,
        ),
        (
            "affinity: the matching Pod's region scores highest",
            json!({"labels": s1, "affinity": stay_s1_region}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s2}),
                json!({"node": "node3", "labels": s1}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", az1.clone()),
            ],
            Some(vec![100, 0, 0]),
        ),
        (
            "every node in the matching region gets the same score",
            json!({"affinity": stay_s1_region}),
            vec![json!({"node": "node1", "labels": s1})],
            vec![
                ("node1", china.clone()),
                ("node2", china_az1.clone()),
                ("node3", india.clone()),
            ],
            Some(vec![100, 100, 0]),
        ),
        (
            "the region with more matching Pods scores highest",
            json!({"labels": s1, "affinity": stay_s2_region}),
            vec![
                json!({"node": "node1", "labels": s2}),
                json!({"node": "node1", "labels": s2}),
                json!({"node": "node2", "labels": s2}),
                json!({"node": "node3", "labels": s2}),
                json!({"node": "node4", "labels": s2}),
                json!({"node": "node5", "labels": s2}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", china.clone()),
                ("node4", china.clone()),
                ("node5", india.clone()),
            ],
            Some(vec![100, 0, 100, 100, 0]),
        ),
        (
            "different operators and values, some failing to match",
            json!({"labels": s1, "affinity": affinity3}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s2}),
                json!({"node": "node3", "labels": s1}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", az1.clone()),
            ],
            Some(vec![20, 100, 0]),
        ),
        (
            "symmetry: existing Pods' preferred affinity matching the Pod",
            json!({"labels": s2}),
            vec![
                json!({"node": "node1", "labels": s1, "affinity": stay_s1_region}),
                json!({"node": "node2", "labels": s2, "affinity": stay_s2_region}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", az1.clone()),
            ],
            Some(vec![0, 100, 0]),
        ),
        (
            "symmetry: existing Pods' required affinity counts hardPodAffinityWeight",
            json!({"labels": s1}),
            vec![
                json!({"node": "node1", "labels": s1, "affinity": hard}),
                json!({"node": "node2", "labels": s2, "affinity": hard}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", india.clone()),
                ("node3", az1.clone()),
            ],
            Some(vec![100, 100, 0]),
        ),
        (
            "anti-affinity: the node without matching Pods scores highest",
            json!({"labels": s1, "affinity": away_s1_az}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s2}),
            ],
            vec![("node1", az1.clone()), ("node2", china.clone())],
            Some(vec![0, 100]),
        ),
        (
            "anti-affinity: a node without the topology key scores highest",
            json!({"labels": s1, "affinity": away_s1_az}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s1}),
            ],
            vec![("node1", az1.clone()), ("node2", china.clone())],
            Some(vec![0, 100]),
        ),
        (
            "anti-affinity symmetry",
            json!({"labels": s2}),
            vec![
                json!({"node": "node1", "labels": s1, "affinity": away_s2_az}),
                json!({"node": "node2", "labels": s2, "affinity": away_s1_az}),
            ],
            vec![("node1", az1.clone()), ("node2", az2.clone())],
            Some(vec![0, 100]),
        ),
        (
            "affinity and anti-affinity with the same labels",
            json!({"labels": s1, "affinity": stay_s1_away_s2}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s1}),
                json!({"node": "node3", "labels": s1}),
                json!({"node": "node3", "labels": s1}),
                json!({"node": "node4", "labels": s1}),
                json!({"node": "node5", "labels": s1}),
            ],
            vec![
                ("node1", china_az1.clone()),
                ("node2", india.clone()),
                ("node3", china.clone()),
                ("node4", china.clone()),
                ("node5", india.clone()),
            ],
            Some(vec![100, 0, 100, 100, 0]),
        ),
        (
            "affinity, anti-affinity and symmetry together",
            json!({"labels": s1, "affinity": stay_s1_away_s2}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "labels": s2}),
                json!({"node": "node3", "affinity": stay_s1_away_s2}),
                json!({"node": "node4", "affinity": away_s1_az}),
            ],
            vec![
                ("node1", china.clone()),
                ("node2", az1.clone()),
                ("node3", india.clone()),
                ("node4", az2.clone()),
            ],
            Some(vec![100, 0, 100, 0]),
        ),
        (
            "partial nodes of a topology without Pods with affinity (upstream #82796)",
            json!({"labels": s1}),
            vec![
                json!({"node": "node1", "labels": s1}),
                json!({"node": "node2", "affinity": stay_s1_away_s2}),
            ],
            vec![("node1", china.clone()), ("node2", china.clone())],
            Some(vec![0, 0]),
        ),
    ];
    let pl = plugin(None);
    for (name, incoming, pods, nodes, want) in cases {
        let nodes = nodes.into_iter().map(|(n, l)| node(n, l)).collect();
        let snap = snapshot(nodes, &pods, &[]);
        assert_eq!(scores(&pl, &pod(0, &incoming), &snap), want, "{name}");
    }
}

#[test]
fn score_namespace_selector_symmetry_and_args() {
    let china = json!({"region": "China"});
    let india = json!({"region": "India"});
    let az1 = json!({"az": "az1"});
    let s1 = json!({"security": "S1"});
    let s2 = json!({"security": "S2"});
    let ns = [
        ("subteam1.team1", json!({"team": "team1"})),
        ("subteam2.team1", json!({"team": "team1"})),
        ("subteam1.team2", json!({"team": "team2"})),
        ("subteam2.team2", json!({"team": "team2"})),
    ];
    let with_ns_selector = |t: Value| {
        let mut t = t;
        t["namespaces"] = json!(["subteam2.team2"]);
        t["namespaceSelector"] =
            json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["team1"]}]});
        t
    };
    let aff_ns = preferred(
        vec![weighted(
            5,
            with_ns_selector(term("security", "In", &["S1"], "region")),
        )],
        vec![],
    );
    let anti_ns = preferred(
        vec![],
        vec![weighted(
            5,
            with_ns_selector(term("security", "In", &["S1"], "region")),
        )],
    );
    let stay_s2_region = preferred(
        vec![weighted(6, term("security", "In", &["S2"], "region"))],
        vec![],
    );
    let nodes = || {
        vec![
            node("node1", china.clone()),
            node("node2", india.clone()),
            node("node3", az1.clone()),
        ]
    };
    let pl = plugin(None);

    let snap = snapshot(
        nodes(),
        &[
            json!({"node": "node1", "labels": s1, "affinity": aff_ns}),
            json!({"node": "node2", "labels": s2, "affinity": stay_s2_region}),
        ],
        &ns,
    );
    let incoming = pod(0, &json!({"ns": "subteam1.team1", "labels": s1}));
    assert_eq!(
        scores(&pl, &incoming, &snap),
        Some(vec![100, 0, 0]),
        "affinity symmetry with namespace selector"
    );

    let snap = snapshot(
        nodes(),
        &[
            json!({"node": "node1", "labels": s1, "affinity": anti_ns}),
            json!({"node": "node2", "labels": s2, "affinity": stay_s2_region}),
        ],
        &ns,
    );
    assert_eq!(
        scores(&pl, &incoming, &snap),
        Some(vec![0, 100, 100]),
        "anti-affinity symmetry with namespace selector"
    );

    // The incoming Pod's own namespaceSelector: Pods in team1 namespaces and subteam2.team2.
    let snap = snapshot(
        nodes(),
        &[
            json!({"node": "node1", "ns": "subteam2.team1", "labels": s1}),
            json!({"node": "node2", "ns": "subteam1.team2", "labels": s1}),
        ],
        &ns,
    );
    let incoming = pod(
        0,
        &json!({"ns": "subteam1.team1", "labels": s1, "affinity": aff_ns}),
    );
    assert_eq!(
        scores(&pl, &incoming, &snap),
        Some(vec![100, 0, 0]),
        "affinity with pods matching namespaceSelector"
    );

    // hardPodAffinityWeight 0 ignores existing Pods' required affinity.
    let hard = required(vec![term("security", "In", &["S1"], "region")], vec![]);
    let snap = snapshot(
        nodes(),
        &[json!({"node": "node1", "labels": s2, "affinity": hard})],
        &[],
    );
    let incoming = pod(0, &json!({"labels": s1}));
    assert_eq!(scores(&pl, &incoming, &snap), Some(vec![100, 0, 0]));
    let zero = plugin(Some(json!({"hardPodAffinityWeight": 0})));
    assert_eq!(scores(&zero, &incoming, &snap), None);

    // ignorePreferredTermsOfExistingPods: the incoming Pod without preferred terms is not scored.
    let ignore = plugin(Some(json!({"ignorePreferredTermsOfExistingPods": true})));
    assert_eq!(scores(&ignore, &incoming, &snap), None);
}

#[test]
fn args_are_validated_naming_the_field() {
    for (args, err) in [
        (
            json!({"hardPodAffinityWeight": 101}),
            "args.hardPodAffinityWeight: Invalid value: 101: not in valid range [0, 100]",
        ),
        (
            json!({"hardPodAffinityWeight": -1}),
            "args.hardPodAffinityWeight: Invalid value: -1",
        ),
        (
            json!({"ignorePreferredTermsOfExistingPods": "yes"}),
            "args.ignorePreferredTermsOfExistingPods: invalid type",
        ),
        (json!({"bogus": 1}), "args.bogus: unknown field"),
    ] {
        let e = decode::<InterPodAffinityArgs>(Some(&args), "args").unwrap_err();
        assert!(e.starts_with(err), "{args}: {e}");
    }
    let pl = plugin(Some(
        json!({"kind": "InterPodAffinityArgs", "apiVersion": "kubescheduler.config.k8s.io/v1", "hardPodAffinityWeight": 7}),
    ));
    assert_eq!(pl.args().hard_pod_affinity_weight, 7);
    assert_eq!(plugin(None).args(), &InterPodAffinityArgs::default());
}

#[test]
fn existing_pods_terms_are_parsed_once_per_pod_info_and_leniently() {
    let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}]}});
    let info = PodInfo::new(Arc::new(pod(1, &json!({"affinity": anti}))));
    let first = terms_of(&info);
    assert_eq!(first.required_anti_affinity.len(), 1);
    assert!(Arc::ptr_eq(&first, &terms_of(&info)), "parsed once");
    assert!(
        Arc::ptr_eq(&first, &terms_of(&info.clone())),
        "clones made after the first read share the parsed terms"
    );
    // An updated Pod is a new PodInfo: parsed again.
    let updated = PodInfo::new(Arc::new(pod(1, &json!({}))));
    assert!(terms_of(&updated).required_anti_affinity.is_empty());
    // A kind of terms with an invalid selector is dropped; the others stay.
    let mixed = PodInfo::new(Arc::new(pod(
        2,
        &json!({"affinity": {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}, "topologyKey": "zone"}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}]}
        }}),
    )));
    let t = terms_of(&mixed);
    assert!(t.required_affinity.is_empty());
    assert_eq!(t.required_anti_affinity.len(), 1);
}

#[test]
fn a_term_naming_many_namespaces_matches_each_of_them() {
    let mut n = Namespaces::new((0..3).map(|i| format!("ns{i}")));
    assert!(matches!(n, Namespaces::List(_)));
    for i in 3..20 {
        n.insert(format!("ns{i}"));
    }
    n.insert("ns0".to_string());
    assert!(
        matches!(n, Namespaces::Set(_)),
        "past the list's size: a set"
    );
    assert!((0..20).all(|i| n.contains(&format!("ns{i}"))));
    assert!(!n.contains("ns20") && !n.contains("ns"));
}

#[test]
fn passes_over_every_node_give_the_same_answers_on_one_thread_and_on_four() {
    // 240 nodes in three zones (enough for the parallel passes to use threads), one or two Pods
    // each: every fifth with a required anti-affinity against role=web on its zone, every third
    // with a required affinity to role=web (scored with hardPodAffinityWeight), every seventh
    // preferring role=web away from its node.
    let nodes: Vec<NodeInfo> = (0..240)
        .map(|i| {
            node(
                &format!("n{i}"),
                json!({"zone": format!("z{}", i % 3), "kubernetes.io/hostname": format!("n{i}")}),
            )
        })
        .collect();
    let mut pods = Vec::new();
    for i in 0..240 {
        let n = format!("n{i}");
        let mut affinity = serde_json::Map::new();
        if i % 5 == 0 && i % 3 != 0 {
            affinity.insert(
                "podAntiAffinity".into(),
                json!({"requiredDuringSchedulingIgnoredDuringExecution": [
                    term("role", "In", &["web"], "kubernetes.io/hostname")]}),
            );
        }
        if i % 3 == 0 {
            affinity.insert(
                "podAffinity".into(),
                json!({"requiredDuringSchedulingIgnoredDuringExecution": [
                    term("role", "In", &["web"], "zone")]}),
            );
        }
        if i % 7 == 0 {
            affinity.insert(
                "podAntiAffinity".into(),
                json!({"preferredDuringSchedulingIgnoredDuringExecution": [
                    weighted(4, term("role", "In", &["web"], "kubernetes.io/hostname"))]}),
            );
        }
        pods.push(
            json!({"node": n, "labels": {"app": format!("a{}", i % 4)}, "affinity": affinity}),
        );
        if i % 2 == 0 {
            pods.push(json!({"node": n, "labels": {"app": "db"}}));
        }
    }
    let snap = snapshot(nodes, &pods, &[]);
    let incoming = pod(
        1,
        &json!({"labels": {"role": "web"}, "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term("app", "In", &["a1", "a2"], "zone")],
                "preferredDuringSchedulingIgnoredDuringExecution": [weighted(5, term("app", "In", &["db"], "kubernetes.io/hostname"))]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term("app", "In", &["a3"], "kubernetes.io/hostname")],
                "preferredDuringSchedulingIgnoredDuringExecution": [weighted(3, term("app", "In", &["a0"], "zone"))]
            }
        }}),
    );
    let one = InterPodAffinity::new(valid(None), 1);
    let four = InterPodAffinity::new(valid(None), 4);
    let filtered = filter_all(&one, &incoming, &snap);
    assert_eq!(filtered, filter_all(&four, &incoming, &snap));
    let rejected = filtered.iter().filter(|r| r.is_some()).count();
    assert!(
        rejected > 0 && rejected < filtered.len(),
        "the case must both admit and reject nodes: {rejected} of {} rejected",
        filtered.len()
    );
    let scored = scores(&one, &incoming, &snap).expect("scored");
    assert_eq!(Some(&scored), scores(&four, &incoming, &snap).as_ref());
    assert!(
        scored.iter().min() != scored.iter().max(),
        "the case must score nodes differently"
    );
}
