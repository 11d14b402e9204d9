//! From the metrics' proposal to the replica count written (upstream's `normalizeDesiredReplicas`
//! and `normalizeDesiredReplicasWithBehaviors`): the stabilisation window over an autoscaler's
//! recent recommendations, then the limits: without `behavior`, minReplicas, maxReplicas and a
//! scale-up of at most max(2 × current, 4); with `behavior`, its scale-up and scale-down windows
//! and policies (Pods / Percent per period, selectPolicy Max, Min or Disabled) over the scale
//! events it made within the longest policy period.
//!
//! Owns each autoscaler's [`History`] (recommendations and scale events, kept in memory as
//! upstream keeps them; a restart starts afresh) and the reason/message pairs of the AbleToScale
//! and ScalingLimited conditions the normalisation sets. Pure: the time is an argument.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{HPAScalingPolicy, HPAScalingRules};
use k8s_openapi::jiff::Timestamp;

/// One recommendation: the metrics' proposal at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recommendation {
    /// The proposed replica count.
    pub replicas: i32,
    /// When.
    pub at: Timestamp,
}

/// One rescale the controller made (with `behavior` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    /// Replicas added or removed (non-negative).
    pub change: i32,
    /// When.
    pub at: Timestamp,
    /// Older than the longest policy period: its slot may be reused.
    pub outdated: bool,
}

/// What the controller remembers of one autoscaler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Recent recommendations (one slot per sync within the window, reused once out of it).
    pub recommendations: Vec<Recommendation>,
    /// Recent scale-ups.
    pub scale_up_events: Vec<ScaleEvent>,
    /// Recent scale-downs.
    pub scale_down_events: Vec<ScaleEvent>,
}

/// A condition's reason and message, as the normalisation decides them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// AbleToScale's reason and message.
    pub able_to_scale: (&'static str, &'static str),
    /// ScalingLimited: whether it is True, reason and message.
    pub limited: (bool, &'static str, &'static str),
}

/// The ceiling of a scale-up without `behavior` (upstream's `calculateScaleUpLimit`).
const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;

const READY: (&str, &str) = ("ReadyForNewScale", "recommended size matches current size");
const DOWN_STABILIZED: (&str, &str) = (
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const UP_STABILIZED: (&str, &str) = (
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const WITHIN_RANGE: (&str, &str) = (
    "DesiredWithinRange",
    "the desired count is within the acceptable range",
);
const SCALE_UP_LIMIT: (&str, &str) = (
    "ScaleUpLimit",
    "the desired replica count is increasing faster than the maximum scale rate",
);
const TOO_MANY: (&str, &str) = (
    "TooManyReplicas",
    "the desired replica count is more than the maximum replica count",
);
const SCALE_DOWN_LIMIT: (&str, &str) = (
    "ScaleDownLimit",
    "the desired replica count is decreasing faster than the maximum scale rate",
);
const TOO_FEW: (&str, &str) = (
    "TooFewReplicas",
    "the desired replica count is less than the minimum replica count",
);

fn ago(now: Timestamp, d: Duration) -> Timestamp {
    now.checked_sub(d).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn secs(s: i32) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

impl History {
    /// Starts the recommendations with the current count, once (upstream's
    /// `recordInitialRecommendation`).
    pub fn record_initial(&mut self, current: i32, now: Timestamp) {
        if self.recommendations.is_empty() {
            self.recommendations.push(Recommendation {
                replicas: current,
                at: now,
            });
        }
    }

    /// Stores `rec` in the slot of a recommendation `is_old` says is out of every window, or
    /// appends it.
    fn store(&mut self, rec: Recommendation, is_old: impl Fn(&Recommendation) -> bool) {
        match self.recommendations.iter().rposition(is_old) {
            Some(i) => self.recommendations[i] = rec,
            None => self.recommendations.push(rec),
        }
    }

    /// The highest recommendation within `window` (the proposal included), recording the
    /// proposal (upstream's `stabilizeRecommendation`).
    fn stabilize(&mut self, proposal: i32, window: Duration, now: Timestamp) -> i32 {
        let cutoff = ago(now, window);
        let max = self
            .recommendations
            .iter()
            .filter(|r| r.at >= cutoff)
            .map(|r| r.replicas)
            .fold(proposal, i32::max);
        self.store(
            Recommendation {
                replicas: proposal,
                at: now,
            },
            |r| r.at < cutoff,
        );
        max
    }

    /// Records a rescale from `previous` to `new` (with `behavior` only, as upstream's
    /// `storeScaleEvent`).
    pub fn store_scale_event(
        &mut self,
        rules: (&HPAScalingRules, &HPAScalingRules),
        previous: i32,
        new: i32,
        now: Timestamp,
    ) {
        let (events, rules, change) = if new > previous {
            (&mut self.scale_up_events, rules.0, new - previous)
        } else {
            (&mut self.scale_down_events, rules.1, previous - new)
        };
        let cutoff = ago(now, secs(longest_policy_period(rules)));
        for e in events.iter_mut() {
            if e.at < cutoff {
                e.outdated = true;
            }
        }
        let event = ScaleEvent {
            change,
            at: now,
            outdated: false,
        };
        match events.iter().rposition(|e| e.outdated) {
            Some(i) => events[i] = event,
            None => events.push(event),
        }
    }
}

fn longest_policy_period(rules: &HPAScalingRules) -> i32 {
    rules
        .policies
        .iter()
        .flatten()
        .map(|p| p.period_seconds)
        .max()
        .unwrap_or(0)
}

/// Without `behavior`: the highest recommendation of the downscale stabilisation window, then
/// minReplicas, maxReplicas and the scale-up ceiling.
pub fn normalize(
    history: &mut History,
    current: i32,
    proposal: i32,
    min: i32,
    max: i32,
    window: Duration,
    now: Timestamp,
) -> (i32, Verdict) {
    let stabilized = history.stabilize(proposal, window, now);
    let able_to_scale = if stabilized != proposal {
        DOWN_STABILIZED
    } else {
        READY
    };
    let (desired, limit) = limit_by_rules(current, stabilized, min, max);
    (
        desired,
        Verdict {
            able_to_scale,
            limited: (desired != stabilized, limit.0, limit.1),
        },
    )
}

/// Upstream's `convertDesiredReplicasWithRules`.
fn limit_by_rules(
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
) -> (i32, (&'static str, &'static str)) {
    let scale_up_limit =
        (SCALE_UP_LIMIT_FACTOR * f64::from(current)).max(SCALE_UP_LIMIT_MINIMUM) as i32;
    let (maximum, reason) = if max > scale_up_limit {
        (scale_up_limit, SCALE_UP_LIMIT)
    } else {
        (max, TOO_MANY)
    };
    if desired < min {
        (min, TOO_FEW)
    } else if desired > maximum {
        (maximum, reason)
    } else {
        (desired, WITHIN_RANGE)
    }
}

/// `behavior`'s rules with the API server's defaults filled in where a client left them out
/// (the API server defaults them on write; this covers an object read before that), and the
/// scale-down window defaulting to `--horizontal-pod-autoscaler-downscale-stabilization`.
pub fn effective_rules(
    up: Option<&HPAScalingRules>,
    down: Option<&HPAScalingRules>,
    downscale_window: Duration,
) -> (HPAScalingRules, HPAScalingRules) {
    let policy = |type_: &str, value: i32| HPAScalingPolicy {
        type_: type_.to_string(),
        value,
        period_seconds: 15,
    };
    let mut up_rules = HPAScalingRules {
        select_policy: Some("Max".to_string()),
        stabilization_window_seconds: Some(0),
        policies: Some(vec![policy("Pods", 4), policy("Percent", 100)]),
        tolerance: None,
    };
    let mut down_rules = HPAScalingRules {
        select_policy: Some("Max".to_string()),
        stabilization_window_seconds: None,
        policies: Some(vec![policy("Percent", 100)]),
        tolerance: None,
    };
    for (from, to) in [(up, &mut up_rules), (down, &mut down_rules)] {
        let Some(from) = from else { continue };
        if from.select_policy.is_some() {
            to.select_policy = from.select_policy.clone();
        }
        if from.stabilization_window_seconds.is_some() {
            to.stabilization_window_seconds = from.stabilization_window_seconds;
        }
        if from.policies.is_some() {
            to.policies = from.policies.clone();
        }
    }
    if down_rules.stabilization_window_seconds.is_none() {
        down_rules.stabilization_window_seconds =
            Some(i32::try_from(downscale_window.as_secs()).unwrap_or(i32::MAX));
    }
    (up_rules, down_rules)
}

/// With `behavior` (its rules from [`effective_rules`]): the scale-up window's lowest and the
/// scale-down window's highest recommendation bound the proposal, then the policies' rate and
/// minReplicas / maxReplicas.
#[allow(clippy::too_many_arguments)]
pub fn normalize_with_behavior(
    history: &mut History,
    up: &HPAScalingRules,
    down: &HPAScalingRules,
    current: i32,
    proposal: i32,
    min: i32,
    max: i32,
    now: Timestamp,
) -> (i32, Verdict) {
    let up_cutoff = ago(now, secs(up.stabilization_window_seconds.unwrap_or(0)));
    let down_cutoff = ago(now, secs(down.stabilization_window_seconds.unwrap_or(0)));
    let (mut up_rec, mut down_rec) = (proposal, proposal);
    for r in &history.recommendations {
        if r.at > up_cutoff {
            up_rec = up_rec.min(r.replicas);
        }
        if r.at > down_cutoff {
            down_rec = down_rec.max(r.replicas);
        }
    }
    let stabilized = current.max(up_rec).min(down_rec);
    history.store(
        Recommendation {
            replicas: proposal,
            at: now,
        },
        |r| r.at < up_cutoff && r.at < down_cutoff,
    );
    let able_to_scale = if stabilized == proposal {
        READY
    } else if proposal >= current {
        UP_STABILIZED
    } else {
        DOWN_STABILIZED
    };
    let (desired, limit) = limit_by_behavior(history, up, down, current, stabilized, min, max, now);
    (
        desired,
        Verdict {
            able_to_scale,
            limited: (desired != stabilized, limit.0, limit.1),
        },
    )
}

/// Replicas changed by `events` within the last `period` seconds.
fn change_in_period(period: i32, events: &[ScaleEvent], now: Timestamp) -> i32 {
    let cutoff = ago(now, secs(period));
    events
        .iter()
        .filter(|e| e.at > cutoff)
        .map(|e| e.change)
        .sum()
}

/// The replica count each policy allows from the count at the start of its period, combined
/// by selectPolicy; `None` when scaling this way is Disabled.
fn policy_limit(
    history: &History,
    rules: &HPAScalingRules,
    current: i32,
    up: bool,
    now: Timestamp,
) -> Option<i32> {
    let select = rules.select_policy.as_deref().unwrap_or("Max");
    if select == "Disabled" {
        return None;
    }
    // Max picks the largest change: the highest count up, the lowest down; Min the reverse.
    let largest_change = select != "Min";
    let mut result: Option<i32> = None;
    for p in rules.policies.iter().flatten() {
        let added = change_in_period(p.period_seconds, &history.scale_up_events, now);
        let removed = change_in_period(p.period_seconds, &history.scale_down_events, now);
        let start = current - added + removed;
        let proposed = match (p.type_.as_str(), up) {
            ("Pods", true) => start + p.value,
            ("Pods", false) => start - p.value,
            ("Percent", true) => {
                (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32
            }
            ("Percent", false) => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
            _ => continue,
        };
        let pick_higher = largest_change == up;
        result = Some(match result {
            None => proposed,
            Some(r) if pick_higher => r.max(proposed),
            Some(r) => r.min(proposed),
        });
    }
    // No policy at all: upstream's fold starts from the extreme of the other side.
    Some(result.unwrap_or(if largest_change == up {
        i32::MIN
    } else {
        i32::MAX
    }))
}

/// Upstream's `convertDesiredReplicasWithBehaviorRate`.
#[allow(clippy::too_many_arguments)]
fn limit_by_behavior(
    history: &History,
    up: &HPAScalingRules,
    down: &HPAScalingRules,
    current: i32,
    desired: i32,
    min: i32,
    max: i32,
    now: Timestamp,
) -> (i32, (&'static str, &'static str)) {
    if desired > current {
        let limit = policy_limit(history, up, current, true, now)
            .unwrap_or(current)
            .max(current);
        let (maximum, reason) = if max > limit {
            (limit, SCALE_UP_LIMIT)
        } else {
            (max, TOO_MANY)
        };
        if desired > maximum {
            return (maximum, reason);
        }
    } else if desired < current {
        let limit = policy_limit(history, down, current, false, now)
            .unwrap_or(current)
            .min(current);
        let (minimum, reason) = if min < limit {
            (limit, SCALE_DOWN_LIMIT)
        } else {
            (min, TOO_FEW)
        };
        if desired < minimum {
            return (minimum, reason);
        }
    }
    (desired, WITHIN_RANGE)
}

#[cfg(test)]
#[path = "normalize_tests.rs"]
mod normalize_tests;
