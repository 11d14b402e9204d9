//! Named cases for the Deployment vocabulary (hash, fenceposts, revisions, annotations,
//! conditions, fractions, sort orders).

use super::*;
use serde_json::{json, Value};

fn deployment(replicas: i32, strategy: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "d-uid", "generation": 1},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "strategy": strategy,
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "v1"}]}}}
    }))
    .unwrap()
}

fn rolling(surge: Value, unavailable: Value) -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

fn rs(name: &str, replicas: i32, created: &str, annotations: Value) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                     "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap()
}

fn template(image: &str, labels: Value) -> PodTemplateSpec {
    serde_json::from_value(json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": image}]}
    }))
    .unwrap()
}

#[test]
fn dep9_fenceposts_round_surge_up_and_unavailability_down() {
    struct Case {
        name: &'static str,
        surge: Value,
        unavailable: Value,
        replicas: i32,
        want: Result<(i32, i32), ()>,
    }
    let cases = [
        Case {
            name: "DEP-9 25%/25% of 3: surge 1 (0.75 up), unavailable 0 (0.75 down)",
            surge: json!("25%"),
            unavailable: json!("25%"),
            replicas: 3,
            want: Ok((1, 0)),
        },
        Case {
            name: "DEP-9 25%/25% of 10: surge 3, unavailable 2",
            surge: json!("25%"),
            unavailable: json!("25%"),
            replicas: 10,
            want: Ok((3, 2)),
        },
        Case {
            name: "DEP-9 absolute numbers are taken as they are",
            surge: json!(3),
            unavailable: json!(2),
            replicas: 10,
            want: Ok((3, 2)),
        },
        Case {
            name: "DEP-9 both 0: unavailable becomes 1",
            surge: json!(0),
            unavailable: json!(0),
            replicas: 10,
            want: Ok((0, 1)),
        },
        Case {
            name: "DEP-9 both round to 0: unavailable becomes 1",
            surge: json!("0%"),
            unavailable: json!("5%"),
            replicas: 10,
            want: Ok((0, 1)),
        },
        Case {
            name: "DEP-9 50%/50% of 5: surge 3 (2.5 up), unavailable 2 (2.5 down)",
            surge: json!("50%"),
            unavailable: json!("50%"),
            replicas: 5,
            want: Ok((3, 2)),
        },
        Case {
            name: "DEP-9 1% of 10 surges by 1",
            surge: json!("1%"),
            unavailable: json!("1%"),
            replicas: 10,
            want: Ok((1, 0)),
        },
        Case {
            name: "DEP-9 a string that is not a percentage is an error",
            surge: json!("three"),
            unavailable: json!(0),
            replicas: 10,
            want: Err(()),
        },
    ];
    for c in cases {
        let s: IntOrString = serde_json::from_value(c.surge).unwrap();
        let u: IntOrString = serde_json::from_value(c.unavailable).unwrap();
        let got = resolve_fenceposts(Some(&s), Some(&u), c.replicas).map_err(|_| ());
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn dep9_max_surge_and_max_unavailable_of_a_deployment() {
    let cases = [
        (
            "DEP-9 maxUnavailable never exceeds replicas",
            deployment(3, rolling(json!(0), json!(5))),
            (0, 3),
        ),
        (
            "DEP-9 Recreate has neither surge nor unavailability",
            deployment(3, json!({"type": "Recreate"})),
            (0, 0),
        ),
        (
            "DEP-9 0 replicas: maxUnavailable 0",
            deployment(0, rolling(json!(1), json!(1))),
            (1, 0),
        ),
        (
            "DEP-9 defaults (25%/25%) apply to an unset strategy",
            with_defaults(&deployment(10, json!({}))),
            (3, 2),
        ),
    ];
    for (name, d, want) in cases {
        assert_eq!((max_surge(&d), max_unavailable(&d)), want, "{name}");
    }
}

#[test]
fn dep1_hash_is_fnv32a_safe_encoded_and_moves_with_collision_count() {
    let t1 = template("v1", json!({"app": "web"}));
    let t2 = template("v2", json!({"app": "web"}));
    let h1 = compute_hash(&t1, None);
    assert_eq!(h1, compute_hash(&t1.clone(), None), "DEP-1 deterministic");
    assert!(
        h1.chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
            && !h1.is_empty(),
        "DEP-1 hash {h1} uses the safe alphabet"
    );
    assert_ne!(
        h1,
        compute_hash(&t2, None),
        "DEP-1 another template, another hash"
    );
    assert_ne!(
        h1,
        compute_hash(&t1, Some(0)),
        "DEP-1 a set collisionCount (even 0) is hashed in"
    );
    assert_ne!(
        compute_hash(&t1, Some(0)),
        compute_hash(&t1, Some(1)),
        "DEP-1 collisionCount bump moves the hash"
    );
    let mut reordered = t1.clone();
    reordered
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap()
        .insert("a".into(), "b".into());
    let mut reordered2 = t1.clone();
    let labels = reordered2
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap();
    let mut fresh = BTreeMap::new();
    fresh.insert("a".to_string(), "b".to_string());
    fresh.extend(std::mem::take(labels));
    *labels = fresh;
    assert_eq!(
        compute_hash(&reordered, None),
        compute_hash(&reordered2, None),
        "DEP-1 the hash does not depend on map order"
    );
    let mut empties = t1.clone();
    empties.spec.as_mut().unwrap().volumes = Some(vec![]);
    assert_eq!(
        h1,
        compute_hash(&empties, None),
        "DEP-1 an empty list hashes as a missing one (nil and empty are equal upstream)"
    );
}

#[test]
fn dep1_replica_set_names() {
    let long = "d".repeat(260);
    let cases = [
        (
            "DEP-1 <deployment>-<hash>",
            "web",
            "abc",
            "web-abc".to_string(),
        ),
        (
            "DEP-1 long names are cut to fit 253 characters",
            long.as_str(),
            "abcde",
            format!("{}-abcde", "d".repeat(247)),
        ),
    ];
    for (name, d, hash, want) in cases {
        let got = replica_set_name(d, hash);
        assert_eq!(got, want, "{name}");
        assert!(got.len() <= 253, "{name}");
    }
}

#[test]
fn dep15_template_equality_ignores_the_hash_label_only() {
    let d = template("v1", json!({"app": "web"}));
    let cases = [
        (
            "DEP-15 same template with the hash label",
            template("v1", json!({"app": "web", "pod-template-hash": "x"})),
            true,
        ),
        (
            "DEP-15 another image",
            template("v2", json!({"app": "web", "pod-template-hash": "x"})),
            false,
        ),
        (
            "DEP-15 another label",
            template("v1", json!({"app": "web", "tier": "a"})),
            false,
        ),
    ];
    for (name, rs_template, want) in cases {
        assert_eq!(equal_ignore_hash(&d, &rs_template), want, "{name}");
    }
}

#[test]
fn dep15_revisions() {
    let t = "2024-01-01T00:00:00Z";
    let rss = [
        rs("a", 0, t, json!({REVISION: "3"})),
        rs("b", 0, t, json!({REVISION: "7"})),
        rs("c", 0, t, json!({REVISION: "junk"})),
        rs("d", 0, t, json!({})),
        rs("e", 0, t, json!({REVISION: "5"})),
    ];
    assert_eq!(
        max_revision(&rss),
        7,
        "DEP-15 highest revision, junk skipped"
    );
    assert_eq!(
        last_revision(&rss),
        5,
        "DEP-15 undo goes to the second highest"
    );
    assert_eq!(
        revision(&rss[3].metadata.annotations),
        Ok(0),
        "DEP-15 missing is 0"
    );
    assert!(revision(&rss[2].metadata.annotations).is_err());
}

#[test]
fn dep15_new_replica_set_annotations() {
    let mut d = deployment(3, rolling(json!(1), json!(0)));
    d.metadata.annotations = Some(
        [
            ("team", "a"),
            (LAST_APPLIED, "{}"),
            (REVISION, "9"),
            (DEPRECATED_ROLLBACK_TO, "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    struct Case {
        name: &'static str,
        rs: Value,
        revision: &'static str,
        exists: bool,
        limit: usize,
        want_changed: bool,
        want: Value,
    }
    let cases = [
        Case {
            name: "DEP-7 a created ReplicaSet: copied annotations, revision, desired and max",
            rs: json!({}),
            revision: "1",
            exists: false,
            limit: 2000,
            want_changed: true,
            want: json!({"team": "a", REVISION: "1", DESIRED_REPLICAS: "3", MAX_REPLICAS: "4"}),
        },
        Case {
            name:
                "DEP-15 a reused ReplicaSet gets the new highest revision, the old one in history",
            rs: json!({"team": "a", REVISION: "2", REVISION_HISTORY: "1"}),
            revision: "5",
            exists: true,
            limit: 2000,
            want_changed: true,
            want: json!({"team": "a", REVISION: "5", REVISION_HISTORY: "1,2"}),
        },
        Case {
            name: "DEP-15 the first reuse starts the history",
            rs: json!({"team": "a", REVISION: "2"}),
            revision: "5",
            exists: true,
            limit: 2000,
            want_changed: true,
            want: json!({"team": "a", REVISION: "5", REVISION_HISTORY: "2"}),
        },
        Case {
            name: "DEP-15 history over its length limit drops its oldest entries",
            rs: json!({"team": "a", REVISION: "30", REVISION_HISTORY: "10,20"}),
            revision: "40",
            exists: true,
            limit: 5,
            want_changed: true,
            want: json!({"team": "a", REVISION: "40", REVISION_HISTORY: "20,30"}),
        },
        Case {
            name: "DEP-15 already the highest: nothing changes",
            rs: json!({"team": "a", REVISION: "5"}),
            revision: "5",
            exists: true,
            limit: 2000,
            want_changed: false,
            want: json!({"team": "a", REVISION: "5"}),
        },
        Case {
            name: "DEP-15 ReplicaSet-only annotations are kept, changed ones overwritten",
            rs: json!({"team": "b", "mine": "x", REVISION: "5"}),
            revision: "5",
            exists: true,
            limit: 2000,
            want_changed: true,
            want: json!({"team": "a", "mine": "x", REVISION: "5"}),
        },
    ];
    for c in cases {
        let mut r = rs("r", 1, "2024-01-01T00:00:00Z", c.rs);
        let changed = set_new_replica_set_annotations(&d, &mut r, c.revision, c.exists, c.limit);
        assert_eq!(changed, c.want_changed, "{}", c.name);
        let want: BTreeMap<String, String> = serde_json::from_value(c.want).unwrap();
        assert_eq!(r.metadata.annotations.unwrap(), want, "{}", c.name);
    }
}

#[test]
fn dep6_fraction_and_proportion() {
    // Deployment scaled from 10 (max-replicas 10, surge 0) to 20.
    let d = deployment(20, rolling(json!(0), json!(1)));
    let t = "2024-01-01T00:00:00Z";
    let cases = [
        (
            "DEP-6 fraction: 3 of a max of 10 becomes 6 of 20 (+3)",
            rs("a", 3, t, json!({MAX_REPLICAS: "10"})),
            5,
            0,
            3,
        ),
        (
            "DEP-6 proportion never exceeds what is left to add",
            rs("a", 3, t, json!({MAX_REPLICAS: "10"})),
            5,
            4,
            1,
        ),
        (
            "DEP-6 an empty ReplicaSet gets nothing",
            rs("a", 0, t, json!({MAX_REPLICAS: "10"})),
            5,
            0,
            0,
        ),
        (
            "DEP-6 rounding is half away from zero: 1 of 8 → 2.5 of 20 rounds to 3 (+2)",
            rs("a", 1, t, json!({MAX_REPLICAS: "8"})),
            10,
            0,
            2,
        ),
        (
            "DEP-6 no max-replicas annotation and no status.replicas: 0",
            rs("a", 3, t, json!({})),
            5,
            0,
            0,
        ),
    ];
    for (name, r, to_add, added, want) in cases {
        assert_eq!(
            replica_set_proportion(&r, &d, to_add, added),
            want,
            "{name}"
        );
    }
    let scale_down = deployment(0, rolling(json!(0), json!(1)));
    assert_eq!(
        replica_set_fraction(&rs("a", 4, t, json!({})), &scale_down),
        -4,
        "DEP-6 to 0 replicas: all of it"
    );
}

#[test]
fn dep6_sort_orders() {
    let r = |name: &str, n: i32, t: &str| rs(name, n, t, json!({}));
    let mut rss = vec![
        r("b-old-3", 3, "2024-01-01T00:00:00Z"),
        r("c-new-3", 3, "2024-01-03T00:00:00Z"),
        r("a-mid-5", 5, "2024-01-02T00:00:00Z"),
        r("d-old-3", 3, "2024-01-01T00:00:00Z"),
    ];
    let names = |v: &[ReplicaSet]| {
        v.iter()
            .map(|r| r.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    };
    rss.sort_by(by_creation);
    assert_eq!(
        names(&rss),
        ["b-old-3", "d-old-3", "a-mid-5", "c-new-3"],
        "DEP-12 by creation, then name"
    );
    rss.sort_by(by_size_newer);
    assert_eq!(
        names(&rss),
        ["a-mid-5", "c-new-3", "d-old-3", "b-old-3"],
        "DEP-6 scale up: larger, then newer"
    );
    rss.sort_by(by_size_older);
    assert_eq!(
        names(&rss),
        ["a-mid-5", "b-old-3", "d-old-3", "c-new-3"],
        "DEP-6 scale down: larger, then older"
    );
}

#[test]
fn dep18_conditions() {
    let now = Time(Timestamp::from_second(1_000).unwrap());
    let later = Time(Timestamp::from_second(2_000).unwrap());
    let mut s = DeploymentStatus::default();
    set_condition(
        &mut s,
        new_condition(PROGRESSING, "True", REASON_RS_UPDATED, "a".into(), &now),
    );
    set_condition(
        &mut s,
        new_condition(AVAILABLE, "True", REASON_MIN_AVAILABLE, "b".into(), &now),
    );
    set_condition(
        &mut s,
        new_condition(PROGRESSING, "True", REASON_RS_UPDATED, "c".into(), &later),
    );
    assert_eq!(
        get_condition(&s, PROGRESSING).unwrap().message.as_deref(),
        Some("a"),
        "DEP-18 same status and reason: the condition is left alone"
    );
    set_condition(
        &mut s,
        new_condition(
            PROGRESSING,
            "True",
            REASON_NEW_RS_AVAILABLE,
            "d".into(),
            &later,
        ),
    );
    let c = get_condition(&s, PROGRESSING).unwrap();
    assert_eq!(
        (c.last_transition_time.clone(), c.last_update_time.clone()),
        (Some(now.clone()), Some(later.clone())),
        "DEP-18 same status, new reason: the transition time stays"
    );
    assert_eq!(
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        [AVAILABLE, PROGRESSING],
        "DEP-18 a replaced condition moves to the end, as upstream"
    );
    set_condition(
        &mut s,
        new_condition(PROGRESSING, "False", REASON_TIMED_OUT, "e".into(), &later),
    );
    assert_eq!(
        get_condition(&s, PROGRESSING).unwrap().last_transition_time,
        Some(later),
        "DEP-18 a status change moves the transition time"
    );
}

#[test]
fn dep18_timed_out_after_the_deadline_only() {
    let mut d = deployment(3, rolling(json!(1), json!(0)));
    d.spec.as_mut().unwrap().progress_deadline_seconds = Some(600);
    let at = |s: i64| Timestamp::from_second(s).unwrap();
    let status = |reason: &str| {
        let mut s = DeploymentStatus::default();
        set_condition(
            &mut s,
            new_condition(PROGRESSING, "True", reason, String::new(), &Time(at(1_000))),
        );
        s
    };
    let cases = [
        (
            "DEP-18 before the deadline",
            status(REASON_RS_UPDATED),
            at(1_600),
            false,
        ),
        (
            "DEP-18 after the deadline",
            status(REASON_RS_UPDATED),
            at(1_601),
            true,
        ),
        (
            "DEP-18 a complete rollout never times out",
            status(REASON_NEW_RS_AVAILABLE),
            at(9_999),
            false,
        ),
        (
            "DEP-18 timed out stays timed out",
            status(REASON_TIMED_OUT),
            at(1_001),
            true,
        ),
    ];
    for (name, s, now, want) in cases {
        assert_eq!(deployment_timed_out(&d, &s, now), want, "{name}");
    }
    d.spec.as_mut().unwrap().progress_deadline_seconds = Some(i32::MAX);
    assert!(
        !deployment_timed_out(&d, &status(REASON_RS_UPDATED), at(100_000_000_000)),
        "DEP-18 i32::MAX means no deadline"
    );
}
