//! Named cases for node affinity, many after upstream's component-helpers tables.

use super::*;
use serde_json::{json, Value};

fn node(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn pod(spec: Value) -> Pod {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c"}]);
    serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
}

fn selector(terms: Value) -> ApiNodeSelector {
    serde_json::from_value(json!({ "nodeSelectorTerms": terms })).unwrap()
}

#[test]
fn node_selector_terms_match_labels_and_fields() {
    let labels = json!({"zone": "a", "gen": "5", "ssd": "true"});
    let cases: Vec<(&str, Value, bool)> = vec![
        ("no terms match nothing", json!([]), false),
        ("an empty term matches nothing", json!([{}]), false),
        (
            "empty matchExpressions and matchFields match nothing",
            json!([{"matchExpressions": [], "matchFields": []}]),
            false,
        ),
        (
            "In matches a listed value",
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "a"]}]}]),
            true,
        ),
        (
            "In does not match a missing label",
            json!([{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]),
            false,
        ),
        (
            "NotIn matches a missing label",
            json!([{"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["a"]}]}]),
            true,
        ),
        (
            "NotIn rejects a listed value",
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]),
            false,
        ),
        (
            "Exists",
            json!([{"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}]),
            true,
        ),
        (
            "DoesNotExist",
            json!([{"matchExpressions": [{"key": "ssd", "operator": "DoesNotExist"}]}]),
            false,
        ),
        (
            "Gt compares integers",
            json!([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}]),
            true,
        ),
        (
            "Lt compares integers",
            json!([{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["5"]}]}]),
            false,
        ),
        (
            "Gt on a non-integer label never matches",
            json!([{"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}]),
            false,
        ),
        (
            "Gt with a non-integer value is a parse error: the term matches nothing",
            json!([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}]),
            false,
        ),
        (
            "an unknown operator is a parse error",
            json!([{"matchExpressions": [{"key": "gen", "operator": "Has"}]}]),
            false,
        ),
        (
            "an invalid value is a parse error",
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["-bad"]}]}]),
            false,
        ),
        (
            "expressions in a term are ANDed",
            json!([{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "ssd", "operator": "DoesNotExist"}]}]),
            false,
        ),
        (
            "terms are ORed; a term with a parse error does not stop the next",
            json!([
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]),
            true,
        ),
        (
            "matchFields metadata.name In",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
            true,
        ),
        (
            "matchFields metadata.name NotIn",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]),
            false,
        ),
        (
            "matchFields with two values is a parse error",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]),
            false,
        ),
        (
            "matchFields Exists is a parse error",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]),
            false,
        ),
        (
            "one term: fields match, labels do not",
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
            false,
        ),
        (
            "one term: both match",
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
            true,
        ),
        (
            "two terms: fields term fails, labels term matches",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
                   {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]),
            true,
        ),
    ];
    let n = node("n1", labels);
    for (name, terms, want) in cases {
        assert_eq!(
            match_node_selector_terms(&n, &selector(terms)),
            want,
            "{name}"
        );
    }
}

#[test]
fn match_fields_are_not_checked_on_a_node_without_a_name() {
    let n = node("", json!({}));
    let s = selector(
        json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
    );
    assert!(match_node_selector_terms(&n, &s));
}

#[test]
fn strict_parse_names_the_field() {
    let s = selector(json!([
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]},
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["1", "2"]}]}
    ]));
    let err = NodeSelector::parse_strict(&s, "addedAffinity.required").unwrap_err();
    assert!(
        err.starts_with("addedAffinity.required.nodeSelectorTerms[1].matchExpressions[0].values"),
        "{err}"
    );
    let bad_key = selector(json!([{"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]}]));
    assert!(NodeSelector::parse_strict(&bad_key, "x")
        .unwrap_err()
        .contains("matchExpressions[0].key"));
}

#[test]
fn required_node_affinity_combines_node_selector_and_affinity() {
    let req = |key: &str, op: &str, values: Value| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]}}}})
    };
    let labels = json!({"foo": "bar", "gen": "5"});
    let cases: Vec<(&str, Value, bool)> = vec![
        ("no selector schedules anywhere", json!({}), true),
        (
            "empty nodeSelector schedules anywhere",
            json!({"nodeSelector": {}}),
            true,
        ),
        (
            "missing labels",
            json!({"nodeSelector": {"baz": "x"}}),
            false,
        ),
        ("same labels", json!({"nodeSelector": {"foo": "bar"}}), true),
        (
            "node labels are a superset",
            json!({"nodeSelector": {"gen": "5"}}),
            true,
        ),
        (
            "node labels are a subset",
            json!({"nodeSelector": {"foo": "bar", "baz": "x"}}),
            false,
        ),
        (
            "In matches",
            req("foo", "In", json!(["value1", "bar"])),
            true,
        ),
        ("Gt matches", req("gen", "Gt", json!(["0"])), true),
        (
            "NotIn matches",
            req("foo", "NotIn", json!(["value1"])),
            true,
        ),
        (
            "affinity does not match labels",
            req("foo", "In", json!(["x"])),
            false,
        ),
        (
            "nil nodeSelectorTerms match nothing",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
            false,
        ),
        (
            "affinity with only preferred terms schedules anywhere",
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}),
            true,
        ),
        (
            "affinity matches but nodeSelector does not",
            {
                let mut v = req("foo", "In", json!(["bar"]));
                v["nodeSelector"] = json!({"foo": "other"});
                v
            },
            false,
        ),
        (
            "both match",
            {
                let mut v = req("foo", "In", json!(["bar"]));
                v["nodeSelector"] = json!({"gen": "5"});
                v
            },
            true,
        ),
    ];
    let n = node("n1", labels);
    for (name, spec, want) in cases {
        let r = RequiredNodeAffinity::from_pod(&pod(spec));
        assert_eq!(r.matches(&n), want, "{name}");
        assert_eq!(
            node_matches_pod(&r, None, &n).is_ok(),
            want,
            "{name} (no added affinity)"
        );
    }
}

#[test]
fn added_affinity_is_checked_before_the_pods_own() {
    let added = NodeSelector::parse(&selector(
        json!([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["batch"]}]}]),
    ));
    let r = RequiredNodeAffinity::from_pod(&pod(json!({"nodeSelector": {"zone": "a"}})));
    let cases = [
        ("both match", json!({"pool": "batch", "zone": "a"}), Ok(())),
        (
            "added rejects first",
            json!({"zone": "b"}),
            Err(AffinityMismatch::Enforced),
        ),
        (
            "pod rejects",
            json!({"pool": "batch", "zone": "b"}),
            Err(AffinityMismatch::Pod),
        ),
    ];
    for (name, labels, want) in cases {
        assert_eq!(
            node_matches_pod(&r, Some(&added), &node("n", labels)),
            want,
            "{name}"
        );
    }
}

#[test]
fn preferred_terms_sum_matching_weights() {
    let terms: Vec<PreferredSchedulingTerm> = serde_json::from_value(json!([
        {"weight": 2, "preference": {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}},
        {"weight": 4, "preference": {"matchExpressions": [{"key": "key", "operator": "In", "values": ["value"]}]}},
        {"weight": 5, "preference": {"matchExpressions": [
            {"key": "foo", "operator": "In", "values": ["bar"]},
            {"key": "az", "operator": "In", "values": ["az1"]}]}},
        {"weight": 0, "preference": {"matchExpressions": [{"key": "foo", "operator": "Gt", "values": ["x"]}]}},
        {"weight": 7, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}}
    ]))
    .unwrap();
    let p = PreferredSchedulingTerms::parse(&terms, "preferred").unwrap();
    let cases = [
        ("first term only", node("n1", json!({"foo": "bar"})), 2),
        ("none", node("n2", json!({"key": "other"})), 0),
        (
            "first, second and third",
            node("n1", json!({"foo": "bar", "key": "value", "az": "az1"})),
            11,
        ),
        ("field term", node("n3", json!({})), 7),
    ];
    for (name, n, want) in cases {
        assert_eq!(p.score(&n), want, "{name}");
    }
    let bad: Vec<PreferredSchedulingTerm> = serde_json::from_value(json!([
        {"weight": 1, "preference": {"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}}
    ]))
    .unwrap();
    let err = PreferredSchedulingTerms::parse(&bad, "preferred").unwrap_err();
    assert!(
        err.starts_with("preferred[0].preference.matchFields[0].operator"),
        "{err}"
    );
}
