//! Named cases for NodeAffinity, after upstream's TestNodeAffinity and TestNodeAffinityPriority.

use super::*;
use crate::scheduler::framework::Code;
use crate::scheduler::plugin_args::{decode, valid};
use crate::scheduler::plugins::helper::test_util::*;
use serde_json::{json, Value};

fn required(terms: Value) -> Value {
    json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}})
}

fn nodes(list: &[(&str, Value)]) -> Snapshot {
    snapshot(
        list.iter()
            .map(|(n, labels)| node_info(node(n, json!({"metadata": {"labels": labels}})), vec![]))
            .collect(),
    )
}

/// What PreFilter is expected to say: Skip, Success with the node names it narrows to (None =
/// all), or a rejection.
enum Pre {
    Skip,
    Ok(Option<&'static [&'static str]>),
    Reject(Status),
}

struct FilterCase {
    name: &'static str,
    pod: Value,
    args: Option<Value>,
    nodes: Vec<(&'static str, Value)>,
    pre: Pre,
    /// Filter per node (run with PreFilter's state even for nodes PreFilter excluded, as
    /// upstream's table does).
    want: Vec<Status>,
}

#[test]
fn prefilter_and_filter_per_node() {
    let pod_reject = || unresolvable(&[ERR_REASON_POD]);
    let field_in =
        |names: Value| json!({"key": "metadata.name", "operator": "In", "values": names});
    let foo_in = |v: Value| json!({"key": "foo", "operator": "In", "values": v});
    let cases = vec![
        FilterCase {
            name: "nodeSelector with a label the node lacks",
            pod: json!({"spec": {"nodeSelector": {"foo": "bar"}}}),
            args: None,
            nodes: vec![
                ("node1", json!({})),
                ("node2", json!({"foo": "bar", "baz": "blah"})),
            ],
            pre: Pre::Ok(None),
            want: vec![pod_reject(), ok()],
        },
        FilterCase {
            name: "node labels a subset of the nodeSelector",
            pod: json!({"spec": {"nodeSelector": {"foo": "bar", "baz": "blah"}}}),
            args: None,
            nodes: vec![("node1", json!({"foo": "bar"}))],
            pre: Pre::Ok(None),
            want: vec![pod_reject()],
        },
        FilterCase {
            name: "matchExpressions In / Gt / NotIn / Exists",
            pod: required(json!([{"matchExpressions": [
                foo_in(json!(["bar", "value2"])),
                {"key": "kernel-version", "operator": "Gt", "values": ["0204"]},
                {"key": "mem-type", "operator": "NotIn", "values": ["DDR", "DDR2"]},
                {"key": "GPU", "operator": "Exists"}]}])),
            args: None,
            nodes: vec![
                (
                    "node1",
                    json!({"foo": "bar", "kernel-version": "0206", "mem-type": "DDR3", "GPU": "NVIDIA-GRID-K1"}),
                ),
                (
                    "node2",
                    json!({"foo": "bar", "kernel-version": "0204", "GPU": "x"}),
                ),
                (
                    "node3",
                    json!({"foo": "bar", "kernel-version": "0206", "mem-type": "DDR"}),
                ),
            ],
            pre: Pre::Ok(None),
            want: vec![ok(), pod_reject(), pod_reject()],
        },
        FilterCase {
            name: "empty matchExpressions match nothing",
            pod: required(json!([{"matchExpressions": []}])),
            args: None,
            nodes: vec![("node1", json!({"foo": "bar"}))],
            pre: Pre::Ok(None),
            want: vec![pod_reject()],
        },
        FilterCase {
            name: "no affinity: PreFilter skips",
            pod: json!({}),
            args: None,
            nodes: vec![("node1", json!({"foo": "bar"}))],
            pre: Pre::Skip,
            want: vec![ok()],
        },
        FilterCase {
            name: "affinity without a required node selector: PreFilter skips",
            pod: json!({"spec": {"affinity": {"nodeAffinity": {}}}}),
            args: None,
            nodes: vec![("node1", json!({"foo": "bar"}))],
            pre: Pre::Skip,
            want: vec![ok()],
        },
        FilterCase {
            name: "terms are ORed",
            pod: required(json!([
                {"matchExpressions": [foo_in(json!(["bar"]))]},
                {"matchExpressions": [{"key": "diffkey", "operator": "In", "values": ["wrong", "value2"]}]}])),
            args: None,
            nodes: vec![
                ("node1", json!({"foo": "bar"})),
                ("node2", json!({"diffkey": "value2"})),
                ("node3", json!({})),
            ],
            pre: Pre::Ok(None),
            want: vec![ok(), ok(), pod_reject()],
        },
        FilterCase {
            name: "affinity and nodeSelector must both match",
            pod: {
                let mut p =
                    required(json!([{"matchExpressions": [{"key": "foo", "operator": "Exists"}]}]));
                p["spec"]["nodeSelector"] = json!({"foo": "bar"});
                p
            },
            args: None,
            nodes: vec![
                ("node1", json!({"foo": "bar"})),
                ("node2", json!({"foo": "baz"})),
            ],
            pre: Pre::Ok(None),
            want: vec![ok(), pod_reject()],
        },
        FilterCase {
            name: "an invalid value in a term matches no node",
            pod: required(
                json!([{"matchExpressions": [{"key": "foo", "operator": "NotIn", "values": ["invalid value: ___@#$%^"]}]}]),
            ),
            args: None,
            nodes: vec![("node1", json!({"foo": "bar"}))],
            pre: Pre::Ok(None),
            want: vec![pod_reject()],
        },
        FilterCase {
            name: "matchFields In narrows PreFilter to the named node",
            pod: required(json!([{"matchFields": [field_in(json!(["node1"]))]}])),
            args: None,
            nodes: vec![("node1", json!({})), ("node2", json!({}))],
            pre: Pre::Ok(Some(&["node1"])),
            want: vec![ok(), pod_reject()],
        },
        FilterCase {
            name: "two terms: matchFields does not match, matchExpressions does; no narrowing",
            pod: required(json!([
                {"matchFields": [field_in(json!(["node1"]))]},
                {"matchExpressions": [foo_in(json!(["bar"]))]}])),
            args: None,
            nodes: vec![
                ("node1", json!({})),
                ("node2", json!({"foo": "bar"})),
                ("node3", json!({})),
            ],
            pre: Pre::Ok(None),
            want: vec![ok(), ok(), pod_reject()],
        },
        FilterCase {
            name: "one term: matchFields and matchExpressions ANDed",
            pod: required(json!([{"matchFields": [field_in(json!(["node1"]))],
                                  "matchExpressions": [foo_in(json!(["bar"]))]}])),
            args: None,
            nodes: vec![
                ("node1", json!({"foo": "bar"})),
                ("node2", json!({"foo": "bar"})),
                ("node3", json!({})),
            ],
            pre: Pre::Ok(Some(&["node1"])),
            want: vec![ok(), pod_reject(), pod_reject()],
        },
        FilterCase {
            name: "two terms of node names: their union",
            pod: required(json!([
                {"matchFields": [field_in(json!(["node1"]))]},
                {"matchFields": [field_in(json!(["node2"]))]}])),
            args: None,
            nodes: vec![
                ("node1", json!({})),
                ("node2", json!({})),
                ("node3", json!({})),
            ],
            pre: Pre::Ok(Some(&["node1", "node2"])),
            want: vec![ok(), ok(), pod_reject()],
        },
        FilterCase {
            name: "conflicting node-name requirements in one term: PreFilter rejects",
            pod: required(
                json!([{"matchFields": [field_in(json!(["node1"])), field_in(json!(["node2"]))]}]),
            ),
            args: None,
            nodes: vec![("node1", json!({})), ("node2", json!({}))],
            pre: Pre::Reject(unresolvable(&[ERR_REASON_CONFLICT])),
            want: vec![pod_reject(), pod_reject()],
        },
        FilterCase {
            name: "matches the added affinity and the Pod's",
            pod: required(
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["foo"]}]}]),
            ),
            args: Some(
                json!({"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [field_in(json!(["node1"]))]}]}}}),
            ),
            nodes: vec![("node1", json!({"zone": "foo"}))],
            pre: Pre::Ok(None),
            want: vec![ok()],
        },
        FilterCase {
            name: "matches the added affinity but not the Pod's",
            pod: required(
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["bar"]}]}]),
            ),
            args: Some(
                json!({"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [field_in(json!(["node1"]))]}]}}}),
            ),
            nodes: vec![("node1", json!({"zone": "foo"}))],
            pre: Pre::Ok(None),
            want: vec![pod_reject()],
        },
        FilterCase {
            name: "does not match the added affinity: enforced reason, and no PreFilter skip",
            pod: json!({}),
            args: Some(
                json!({"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["bar"]}]}]}}}),
            ),
            nodes: vec![
                ("node1", json!({"zone": "foo"})),
                ("node2", json!({"zone": "bar"})),
            ],
            pre: Pre::Ok(None),
            want: vec![unresolvable(&[ERR_REASON_ENFORCED]), ok()],
        },
    ];
    for c in cases {
        let pl = NodeAffinity::new(&valid(c.args.as_ref())).unwrap();
        let p = pod(c.pod);
        let snap = nodes(&c.nodes);
        let mut state = CycleState::new();
        let (result, status) = pl.pre_filter(&mut state, &p, &snap);
        match c.pre {
            Pre::Skip => assert!(status.is_skip(), "{}: PreFilter {status}", c.name),
            Pre::Ok(names) => {
                assert!(status.is_success(), "{}: PreFilter {status}", c.name);
                let got = result.and_then(|r| r.node_names);
                let want = names.map(|n| n.iter().map(|s| s.to_string()).collect());
                assert_eq!(got, want, "{}: PreFilter result", c.name);
            }
            Pre::Reject(want) => assert_eq!(status, want, "{}: PreFilter", c.name),
        }
        let got: Vec<Status> = snap
            .nodes
            .iter()
            .map(|n| pl.filter(&state, &p, n))
            .collect();
        assert_eq!(got, c.want, "{}: Filter", c.name);
        // Without PreFilter's state (PreFilter disabled) the Filter result is the same.
        let fresh = CycleState::new();
        let got: Vec<Status> = snap
            .nodes
            .iter()
            .map(|n| pl.filter(&fresh, &p, n))
            .collect();
        assert_eq!(got, c.want, "{}: Filter without PreFilter", c.name);
    }
}

/// Name, Pod, plugin args, nodes with labels, normalized scores (None: PreScore skips).
type ScoreCase = (
    &'static str,
    Value,
    Option<Value>,
    Vec<(&'static str, Value)>,
    Option<Vec<i64>>,
);

#[test]
fn score_per_node() {
    let affinity1 = json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 2, "preference": {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}}]}}}});
    let affinity2 = json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 2, "preference": {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}},
        {"weight": 4, "preference": {"matchExpressions": [{"key": "key", "operator": "In", "values": ["value"]}]}},
        {"weight": 5, "preference": {"matchExpressions": [
            {"key": "foo", "operator": "In", "values": ["bar"]},
            {"key": "key", "operator": "In", "values": ["value"]},
            {"key": "az", "operator": "In", "values": ["az1"]}]}}]}}}});
    let label1 = json!({"foo": "bar"});
    let label2 = json!({"key": "value"});
    let label3 = json!({"az": "az1"});
    let label4 = json!({"abc": "az11", "def": "az22"});
    let label5 = json!({"foo": "bar", "key": "value", "az": "az1"});
    let cases: Vec<ScoreCase> = vec![
        (
            "no preferred affinity: PreScore skips",
            json!({}),
            None,
            vec![("node1", label1.clone())],
            None,
        ),
        (
            "no node matches: all zero",
            affinity1.clone(),
            None,
            vec![
                ("node1", label4.clone()),
                ("node2", label2.clone()),
                ("node3", label3.clone()),
            ],
            Some(vec![0, 0, 0]),
        ),
        (
            "only node1 matches",
            affinity1.clone(),
            None,
            vec![
                ("node1", label1.clone()),
                ("node2", label2.clone()),
                ("node3", label3.clone()),
            ],
            Some(vec![100, 0, 0]),
        ),
        (
            "all match with different weights",
            affinity2.clone(),
            None,
            vec![
                ("node1", label1.clone()),
                ("node5", label5.clone()),
                ("node2", label2.clone()),
            ],
            Some(vec![18, 100, 36]),
        ),
        (
            "added preferred affinity alone",
            json!({}),
            Some(json!({"addedAffinity": affinity1["spec"]["affinity"]["nodeAffinity"].clone()})),
            vec![("node1", label1.clone()), ("node2", label2.clone())],
            Some(vec![100, 0]),
        ),
        (
            "added preferred affinity plus the Pod's",
            affinity1.clone(),
            Some(
                json!({"addedAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 3, "preference": {"matchExpressions": [{"key": "key", "operator": "In", "values": ["value"]}]}}]}}),
            ),
            vec![
                ("node1", label1.clone()),
                ("node2", label2.clone()),
                ("node3", label5.clone()),
            ],
            Some(vec![40, 60, 100]),
        ),
    ];
    for (name, p, args, list, want) in cases {
        let pl = NodeAffinity::new(&valid(args.as_ref())).unwrap();
        let p = pod(p);
        let snap = nodes(&list);
        assert_eq!(run_score(Some(&pl), &pl, &p, &snap), want, "{name}");
        if let Some(want) = want {
            // Without PreScore (disabled) Score parses the terms itself.
            assert_eq!(
                run_score(None, &pl, &p, &snap),
                Some(want),
                "{name}: no PreScore"
            );
        }
    }
}

#[test]
fn prescore_errors_on_a_broken_preferred_term() {
    let p = pod(
        json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 2, "preference": {"matchExpressions": [{"key": "invalid key", "operator": "In", "values": ["bar"]}]}}]}}}}),
    );
    let pl = NodeAffinity::default();
    let status = pl.pre_score(&mut CycleState::new(), &p, &[], &Snapshot::default());
    assert_eq!(status.code, Code::Error);
    assert!(
        status.reasons[0].contains("[0].preference.matchExpressions[0].key"),
        "{status}"
    );
}

#[test]
fn args_errors_name_the_field() {
    let cases = [
        (
            "unknown field",
            json!({"addedAffinitty": {}}),
            "NodeAffinityArgs.addedAffinitty: unknown field",
        ),
        (
            "required term with an invalid operator",
            json!({"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "foo", "operator": "Bad"}]}]}}}),
            "NodeAffinityArgs.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (
            "preferred term with an invalid field requirement",
            json!({"addedAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}}]}}),
            "NodeAffinityArgs.addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchFields[0].values",
        ),
        ("not an object", json!([]), "NodeAffinityArgs: must be an object (NodeAffinityArgs), not []"),
        (
            "addedAffinity of the wrong type",
            json!({"addedAffinity": 3}),
            "NodeAffinityArgs.addedAffinity: ",
        ),
    ];
    for (name, args, want) in cases {
        let err = decode::<NodeAffinityArgs>(Some(&args), "NodeAffinityArgs").unwrap_err();
        assert!(err.starts_with(want), "{name}: {err}");
    }
    let ok = json!({"kind": "NodeAffinityArgs", "apiVersion": "kubescheduler.config.k8s.io/v1"});
    assert!(decode::<NodeAffinityArgs>(Some(&ok), "NodeAffinityArgs").is_ok());
    assert!(decode::<NodeAffinityArgs>(Some(&Value::Null), "NodeAffinityArgs").is_ok());
}
