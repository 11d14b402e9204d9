//! Upstream's normalisation tables (`horizontal_test.go`: TestNormalizeDesiredReplicas,
//! TestConvertDesiredReplicasWithRules, TestScalingWithRules, TestCalculateScale*Limit*,
//! TestStoreScaleEvents), restated.

use super::*;

const NOW: i64 = 1_750_000_000;

fn now() -> Timestamp {
    Timestamp::from_second(NOW).unwrap()
}

fn before(secs: i64) -> Timestamp {
    Timestamp::from_second(NOW - secs).unwrap()
}

fn rec(replicas: i32, secs_ago: i64) -> Recommendation {
    Recommendation {
        replicas,
        at: before(secs_ago),
    }
}

/// Upstream's `generateScalingRules`: selectPolicy Max, a Pods and a Percent policy when
/// non-zero.
fn rules(
    pods: i32,
    pods_period: i32,
    percent: i32,
    percent_period: i32,
    window: i32,
) -> HPAScalingRules {
    let mut policies = Vec::new();
    if pods != 0 {
        policies.push(HPAScalingPolicy {
            type_: "Pods".to_string(),
            value: pods,
            period_seconds: pods_period,
        });
    }
    if percent != 0 {
        policies.push(HPAScalingPolicy {
            type_: "Percent".to_string(),
            value: percent,
            period_seconds: percent_period,
        });
    }
    HPAScalingRules {
        select_policy: Some("Max".to_string()),
        stabilization_window_seconds: Some(window),
        policies: Some(policies),
        tolerance: None,
    }
}

#[test]
fn downscale_stabilization_takes_the_highest_recent_recommendation() {
    // (log, proposal, stabilized, log length after)
    let cases = [
        ("empty log", vec![], 5, 5, 1),
        ("stabilize", vec![rec(4, 120), rec(5, 60)], 3, 5, 3),
        ("no stabilize", vec![rec(1, 120), rec(2, 60)], 3, 3, 3),
        (
            "no stabilize, old recommendations",
            vec![rec(10, 600), rec(9, 540)],
            3,
            3,
            2,
        ),
        (
            "stabilize, old recommendations",
            vec![rec(10, 600), rec(4, 60), rec(5, 120), rec(9, 540)],
            3,
            5,
            4,
        ),
    ];
    for (name, log, proposal, want, len) in cases {
        let mut h = History {
            recommendations: log,
            ..Default::default()
        };
        let got = h.stabilize(proposal, Duration::from_secs(300), now());
        assert_eq!((got, h.recommendations.len()), (want, len), "{name}");
    }
}

#[test]
fn limits_without_behavior() {
    // (current, proposal, min, max, converted, reason)
    let cases = [
        (5, 7, 3, 8, 7, "DesiredWithinRange"),
        (3, 1, 2, 8, 2, "TooFewReplicas"),
        (1, 0, 0, 10, 0, "DesiredWithinRange"),
        (20, 1000, 1, 10, 10, "TooManyReplicas"),
        (3, 1000, 1, 2000, 6, "ScaleUpLimit"),
        (1, 1000, 1, 2000, 4, "ScaleUpLimit"),
    ];
    for (current, proposal, min, max, want, reason) in cases {
        let (got, (r, _)) = limit_by_rules(current, proposal, min, max);
        assert_eq!((got, r), (want, reason), "{current} -> {proposal}");
    }
}

#[test]
fn limits_with_behavior_policies() {
    // (name, up rules, down rules, min, max, current, proposal, expected, reason)
    let d = |up: Option<HPAScalingRules>, down: Option<HPAScalingRules>| {
        effective_rules(up.as_ref(), down.as_ref(), Duration::from_secs(300))
    };
    let cases = [
        (
            "within range",
            d(None, None),
            3,
            8,
            5,
            7,
            7,
            "DesiredWithinRange",
        ),
        (
            "below minReplicas",
            d(None, None),
            2,
            8,
            3,
            1,
            2,
            "TooFewReplicas",
        ),
        (
            "zero within range when minReplicas is 0",
            d(None, None),
            0,
            10,
            1,
            0,
            0,
            "DesiredWithinRange",
        ),
        (
            "maxReplicas below the scale-up limit",
            d(None, None),
            1,
            10,
            20,
            1000,
            10,
            "TooManyReplicas",
        ),
        (
            "more than maxReplicas",
            d(None, None),
            100,
            150,
            100,
            1000,
            150,
            "TooManyReplicas",
        ),
        (
            "user scale-up policy limits",
            d(Some(rules(0, 0, 1, 60, 0)), None),
            1,
            2000,
            3,
            1000,
            4,
            "ScaleUpLimit",
        ),
        (
            "user scale-down policy limits",
            d(None, Some(rules(20, 60, 0, 0, 0))),
            3,
            2000,
            1000,
            3,
            980,
            "ScaleDownLimit",
        ),
        (
            "default scale-up behavior",
            d(None, None),
            1,
            1000,
            10,
            50,
            20,
            "ScaleUpLimit",
        ),
        (
            "pods policy larger than percent",
            d(Some(rules(100, 60, 100, 60, 0)), None),
            1,
            1000,
            10,
            500,
            110,
            "ScaleUpLimit",
        ),
        (
            "percent policy larger than pods",
            d(Some(rules(2, 60, 100, 60, 0)), None),
            1,
            1000,
            10,
            500,
            20,
            "ScaleUpLimit",
        ),
        (
            "large pod policy",
            d(Some(rules(100, 60, 0, 0, 0)), None),
            1,
            1000,
            10,
            50,
            50,
            "DesiredWithinRange",
        ),
        (
            "pod policy limits",
            d(Some(rules(30, 60, 0, 0, 0)), None),
            1,
            1000,
            10,
            50,
            40,
            "ScaleUpLimit",
        ),
        (
            "percent policy limits",
            d(Some(rules(0, 0, 200, 60, 0)), None),
            1,
            1000,
            10,
            50,
            30,
            "ScaleUpLimit",
        ),
        (
            "scale-down percent larger than pods",
            d(None, Some(rules(20, 60, 1, 60, 300))),
            1,
            1000,
            100,
            2,
            80,
            "ScaleDownLimit",
        ),
        (
            "scale-down pods larger than percent",
            d(None, Some(rules(2, 60, 1, 60, 300))),
            1,
            1000,
            100,
            2,
            98,
            "ScaleDownLimit",
        ),
        (
            "scale-down to minReplicas",
            d(None, Some(rules(100, 60, 0, 0, 300))),
            1,
            1000,
            10,
            0,
            1,
            "TooFewReplicas",
        ),
    ];
    for (name, (up, down), min, max, current, proposal, want, reason) in cases {
        let h = History::default();
        let (got, (r, _)) = limit_by_behavior(&h, &up, &down, current, proposal, min, max, now());
        assert_eq!((got, r), (want, reason), "{name}");
    }
}

#[test]
fn select_policy_min_and_disabled() {
    let mut up = rules(2, 60, 50, 60, 300);
    up.select_policy = Some("Min".to_string());
    let h = History::default();
    // Scale-up from 1: Pods +2 = 3, Percent 50 % = 2; Min picks 2.
    assert_eq!(policy_limit(&h, &up, 1, true, now()), Some(2));
    // Scale-down from 5: Pods -2 = 3, Percent 50 % = 2; Min picks the smaller change, 3.
    assert_eq!(policy_limit(&h, &up, 5, false, now()), Some(3));
    up.select_policy = Some("Disabled".to_string());
    assert_eq!(policy_limit(&h, &up, 5, false, now()), None);
    let (down, _) = effective_rules(Some(&up), None, Duration::from_secs(300));
    let (got, (r, _)) = limit_by_behavior(&h, &down, &down, 5, 10, 1, 20, now());
    assert_eq!(
        (got, r),
        (5, "ScaleUpLimit"),
        "disabled scale-up keeps the count"
    );
}

#[test]
fn policies_count_the_changes_within_their_period() {
    // 10 replicas now after +4 within the last minute: a Pods 4 / 60 s policy allows no more.
    let mut h = History::default();
    h.scale_up_events.push(ScaleEvent {
        change: 4,
        at: before(30),
        outdated: false,
    });
    let up = rules(4, 60, 0, 0, 0);
    let down = rules(0, 0, 100, 15, 300);
    let (got, (r, _)) = limit_by_behavior(&h, &up, &down, 10, 20, 1, 100, now());
    assert_eq!((got, r), (10, "ScaleUpLimit"));
    // Out of the period, the policy allows 4 again.
    h.scale_up_events[0].at = before(61);
    let (got, _) = limit_by_behavior(&h, &up, &down, 10, 20, 1, 100, now());
    assert_eq!(got, 14);
}

#[test]
fn scale_events_reuse_outdated_slots() {
    let up = rules(4, 60, 100, 120, 0);
    let down = rules(0, 0, 100, 60, 300);
    let mut h = History {
        scale_up_events: vec![
            ScaleEvent {
                change: 1,
                at: before(200),
                outdated: false,
            },
            ScaleEvent {
                change: 2,
                at: before(100),
                outdated: false,
            },
        ],
        ..History::default()
    };
    h.store_scale_event((&up, &down), 3, 6, now());
    // The longest up period is 120 s: the first event is outdated and replaced.
    assert_eq!(h.scale_up_events.len(), 2);
    assert_eq!(
        h.scale_up_events[0],
        ScaleEvent {
            change: 3,
            at: now(),
            outdated: false
        }
    );
    h.store_scale_event((&up, &down), 6, 4, now());
    assert_eq!(
        h.scale_down_events,
        vec![ScaleEvent {
            change: 2,
            at: now(),
            outdated: false
        }]
    );
}

#[test]
fn behavior_windows_bound_the_recommendation() {
    let (up, down) = effective_rules(
        Some(&rules(100, 15, 0, 0, 60)),
        Some(&rules(100, 15, 0, 0, 120)),
        Duration::from_secs(300),
    );
    // Scale-up window 60 s: a recommendation of 4 thirty seconds ago holds a proposal of 8 to 4.
    let mut h = History {
        recommendations: vec![rec(4, 30)],
        ..Default::default()
    };
    let (got, v) = normalize_with_behavior(&mut h, &up, &down, 3, 8, 1, 10, now());
    assert_eq!((got, v.able_to_scale.0), (4, "ScaleUpStabilized"));
    // Scale-down window 120 s: a recommendation of 7 ninety seconds ago holds 2 at 5 (current).
    let mut h = History {
        recommendations: vec![rec(7, 90)],
        ..Default::default()
    };
    let (got, v) = normalize_with_behavior(&mut h, &up, &down, 5, 2, 1, 10, now());
    assert_eq!((got, v.able_to_scale.0), (5, "ScaleDownStabilized"));
    // The scale-down window defaults to the flag when behavior leaves it out.
    let (_, down) = effective_rules(
        None,
        Some(&HPAScalingRules::default()),
        Duration::from_secs(42),
    );
    assert_eq!(down.stabilization_window_seconds, Some(42));
}

#[test]
fn normalize_sets_the_conditions_reasons() {
    let mut h = History {
        recommendations: vec![rec(6, 60)],
        ..Default::default()
    };
    let (got, v) = normalize(&mut h, 5, 3, 1, 10, Duration::from_secs(300), now());
    assert_eq!(got, 6);
    assert_eq!(v.able_to_scale.0, "ScaleDownStabilized");
    assert_eq!(
        v.limited,
        (
            false,
            "DesiredWithinRange",
            "the desired count is within the acceptable range"
        )
    );
    let (got, v) = normalize(
        &mut History::default(),
        5,
        30,
        1,
        8,
        Duration::from_secs(300),
        now(),
    );
    assert_eq!(got, 8);
    assert_eq!(v.able_to_scale.0, "ReadyForNewScale");
    assert!(v.limited.0);
    assert_eq!(v.limited.1, "TooManyReplicas");
}
