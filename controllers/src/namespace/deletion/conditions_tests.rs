//! The namespace conditions, over upstream's `status_condition_utils_test.go` tables
//! (TestUpdateConditions, TestProcessContentTotals) in this project's words, plus the transition
//! time rule and the content failure message.

use k8s_openapi::api::core::v1::{NamespaceCondition, NamespaceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn cond(type_: &str, status: &str) -> NamespaceCondition {
    NamespaceCondition {
        type_: type_.into(),
        status: status.into(),
        ..Default::default()
    }
}

/// (type, status, reason, message) of each condition, in order.
fn summary(status: &NamespaceStatus) -> Vec<(String, String, String, String)> {
    status
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn ok(type_: &str) -> (String, String, String, String) {
    let (r, m) = ok_variant(type_);
    (type_.into(), "False".into(), r.into(), m.into())
}

fn status_with(conditions: Vec<NamespaceCondition>) -> NamespaceStatus {
    NamespaceStatus {
        conditions: Some(conditions),
        ..Default::default()
    }
}

#[test]
fn a_condition_of_another_type_stays_and_the_five_are_appended_ok() {
    let mut s = status_with(vec![cond("unknown", "True")]);
    assert!(ConditionUpdater::default().update(&mut s, at(10)));
    let mut want = vec![(
        "unknown".into(),
        "True".into(),
        String::new(),
        String::new(),
    )];
    want.extend(TYPES.iter().map(|t| ok(t)));
    assert_eq!(summary(&s), want);
}

#[test]
fn a_failure_not_seen_again_is_replaced_by_its_ok_variant() {
    let mut s = status_with(vec![cond(DISCOVERY_FAILURE, "True")]);
    ConditionUpdater::default().update(&mut s, at(10));
    assert_eq!(summary(&s), TYPES.iter().map(|t| ok(t)).collect::<Vec<_>>());
}

#[test]
fn existing_conditions_keep_their_order() {
    let mut s = status_with(vec![
        cond(GROUP_VERSION_PARSING_FAILURE, "True"),
        cond(DISCOVERY_FAILURE, "True"),
    ]);
    ConditionUpdater::default().update(&mut s, at(10));
    let order: Vec<String> = summary(&s).into_iter().map(|c| c.0).collect();
    assert_eq!(
        order,
        [
            GROUP_VERSION_PARSING_FAILURE,
            DISCOVERY_FAILURE,
            CONTENT_FAILURE,
            CONTENT_REMAINING,
            FINALIZERS_REMAINING
        ]
    );
}

#[test]
fn a_failure_overwrites_an_ok_condition_in_place_and_a_new_one_is_appended() {
    let mut u = ConditionUpdater::default();
    u.group_version_failed("unexpected GroupVersion string: a/b/c");
    let mut s = status_with(vec![
        cond(GROUP_VERSION_PARSING_FAILURE, "False"),
        cond(DISCOVERY_FAILURE, "True"),
    ]);
    u.update(&mut s, at(10));
    let got = summary(&s);
    assert_eq!(
        got[0],
        (
            GROUP_VERSION_PARSING_FAILURE.into(),
            "True".into(),
            "GroupVersionParsingFailed".into(),
            "unexpected GroupVersion string: a/b/c".into()
        )
    );
    assert_eq!(got[1], ok(DISCOVERY_FAILURE));

    // Written fresh: the failure takes its place among the five.
    let mut s = status_with(vec![cond(DISCOVERY_FAILURE, "True")]);
    u.update(&mut s, at(10));
    let got = summary(&s);
    assert_eq!(got[0], ok(DISCOVERY_FAILURE));
    assert_eq!(got[1].0, GROUP_VERSION_PARSING_FAILURE);
    assert_eq!(got[1].1, "True");
}

#[test]
fn the_transition_time_moves_only_with_the_status() {
    let mut u = ConditionUpdater::default();
    u.delete_content_failed("b failed");
    u.delete_content_failed("a failed");
    let mut s = NamespaceStatus::default();
    assert!(u.update(&mut s, at(10)));
    let content = |s: &NamespaceStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == CONTENT_FAILURE)
            .cloned()
            .unwrap()
    };
    let c = content(&s);
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("ContentDeletionFailed"));
    assert_eq!(
        c.message.as_deref(),
        Some("Failed to delete all resource types, 2 remaining: a failed, b failed")
    );
    // The same round again: nothing changes.
    assert!(!u.update(&mut s, at(20)));
    // Another message, same status: the time stays.
    let mut other = ConditionUpdater::default();
    other.delete_content_failed("c failed");
    assert!(other.update(&mut s, at(30)));
    assert_eq!(content(&s).last_transition_time, Some(Time(at(10))));
    // Ok again: the time moves.
    assert!(ConditionUpdater::default().update(&mut s, at(40)));
    assert_eq!(content(&s).last_transition_time, Some(Time(at(40))));
    assert_eq!(content(&s).status, "False");
}

#[test]
fn discovery_failures_say_how_many_groups_failed() {
    let mut u = ConditionUpdater::default();
    u.discovery_failed(
        "unable to retrieve the complete list of server APIs: x",
        Some(2),
    );
    let mut s = NamespaceStatus::default();
    u.update(&mut s, at(1));
    assert_eq!(
        summary(&s)[0],
        (
            DISCOVERY_FAILURE.into(),
            "True".into(),
            "DiscoveryFailed".into(),
            "Discovery failed for some groups, 2 failing: unable to retrieve the complete list of server APIs: x".into()
        )
    );
    let mut whole = ConditionUpdater::default();
    whole.discovery_failed("connection refused", None);
    let mut s = NamespaceStatus::default();
    whole.update(&mut s, at(1));
    assert_eq!(summary(&s)[0].3, "connection refused");
}

/// The content conditions alone (those set True) for `totals`.
fn content_conditions(totals: ContentTotals) -> Vec<(String, String, String, String)> {
    let mut u = ConditionUpdater::default();
    u.content_totals(&totals);
    let mut s = NamespaceStatus::default();
    u.update(&mut s, at(1));
    summary(&s).into_iter().filter(|c| c.1 == "True").collect()
}

#[test]
fn content_totals_become_the_remaining_conditions_sorted() {
    assert!(content_conditions(ContentTotals::default()).is_empty());

    let remaining = ContentTotals {
        remaining: [
            (Gvr::new("apps.k8s.io", "", "deployments"), 5),
            (Gvr::new("apps.k8s.io", "", "daemonsets"), 5),
        ]
        .into(),
        ..Default::default()
    };
    assert_eq!(
        content_conditions(remaining),
        vec![(
            CONTENT_REMAINING.into(),
            "True".into(),
            "SomeResourcesRemain".into(),
            "Some resources are remaining: daemonsets.apps.k8s.io has 5 resource instances, deployments.apps.k8s.io has 5 resource instances".into()
        )]
    );

    let finalizers = ContentTotals {
        finalizers: [("service-catalog".into(), 6), ("kubedb".into(), 5)].into(),
        ..Default::default()
    };
    assert_eq!(
        content_conditions(finalizers),
        vec![(
            FINALIZERS_REMAINING.into(),
            "True".into(),
            "SomeFinalizersRemain".into(),
            "Some content in the namespace has finalizers remaining: kubedb in 5 resource instances, service-catalog in 6 resource instances".into()
        )]
    );

    // The core group prints as an empty group after the dot.
    let both = ContentTotals {
        remaining: [(Gvr::pods(), 2)].into(),
        finalizers: [("example.com/hold".into(), 2)].into(),
    };
    let got = content_conditions(both);
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].3,
        "Some resources are remaining: pods. has 2 resource instances"
    );
    assert_eq!(
        got[1].3,
        "Some content in the namespace has finalizers remaining: example.com/hold in 2 resource instances"
    );
}
