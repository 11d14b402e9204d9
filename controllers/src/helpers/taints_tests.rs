//! Named cases for taints and tolerations, after upstream's tables.

use super::*;
use serde_json::{json, Value};

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    serde_json::from_value(json!({"key": key, "value": value, "effect": effect})).unwrap()
}

fn tolerations(v: Value) -> Vec<Toleration> {
    serde_json::from_value(v).unwrap()
}

#[test]
fn tolerations_follow_operator_and_effect_rules() {
    let t = taint("dedicated", "gpu", "NoSchedule");
    let cases: Vec<(&str, Value, bool)> = vec![
        ("no tolerations", json!([]), false),
        (
            "Equal with the same value",
            json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
            true,
        ),
        (
            "empty operator means Equal",
            json!([{"key": "dedicated", "value": "gpu"}]),
            true,
        ),
        (
            "Equal with another value",
            json!([{"key": "dedicated", "operator": "Equal", "value": "cpu"}]),
            false,
        ),
        (
            "Exists ignores the value",
            json!([{"key": "dedicated", "operator": "Exists"}]),
            true,
        ),
        (
            "empty key with Exists tolerates everything",
            json!([{"operator": "Exists"}]),
            true,
        ),
        (
            "another effect",
            json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]),
            false,
        ),
        (
            "another key",
            json!([{"key": "other", "operator": "Exists"}]),
            false,
        ),
        (
            "an unknown operator tolerates nothing",
            json!([{"key": "dedicated", "operator": "Gt", "value": "gpu"}]),
            false,
        ),
        (
            "any of several",
            json!([{"key": "other", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists"}]),
            true,
        ),
    ];
    for (name, tols, want) in cases {
        assert_eq!(
            tolerations_tolerate_taint(&tolerations(tols), &t),
            want,
            "{name}"
        );
    }
}

#[test]
fn first_untolerated_taint_among_the_selected_effects() {
    let taints = vec![
        taint("soft", "", "PreferNoSchedule"),
        taint("a", "1", "NoSchedule"),
        taint("b", "", "NoExecute"),
    ];
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "nothing tolerated: first NoSchedule/NoExecute",
            json!([]),
            Some("a"),
        ),
        (
            "a tolerated: b",
            json!([{"key": "a", "value": "1"}]),
            Some("b"),
        ),
        (
            "all hard taints tolerated; PreferNoSchedule ignored",
            json!([{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]),
            None,
        ),
    ];
    for (name, tols, want) in cases {
        let got = find_untolerated_taint(&taints, &tolerations(tols), is_do_not_schedule_taint);
        assert_eq!(got.map(|t| t.key.as_str()), want, "{name}");
    }
    assert_eq!(
        find_untolerated_taint(&taints, &[], |_| true).map(|t| t.key.as_str()),
        Some("soft"),
        "no filter: every taint applies"
    );
}

#[test]
fn taints_print_as_upstream() {
    assert_eq!(
        taint_to_string(&taint("k", "v", "NoSchedule")),
        "k=v:NoSchedule"
    );
    assert_eq!(
        taint_to_string(&taint("k", "", "NoSchedule")),
        "k:NoSchedule"
    );
    assert_eq!(taint_to_string(&taint("k", "v", "")), "k=v:");
    assert_eq!(taint_to_string(&taint("k", "", "")), "k");
}
