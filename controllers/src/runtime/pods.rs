//! Which Pods count and which go first on scale-down, as kube-controller-manager v1.34's
//! `controller_utils.go` decides (`IsPodActive`, `FilterActivePods`, `ActivePodsWithRanks`,
//! `getPodsToDelete`, `FindMinNextPodAvailabilityCheck`) and `api/v1/pod` (`IsPodReady`,
//! `IsPodAvailable`).
//!
//! Pure functions over Pods and a caller-given `now`; no I/O, no caches. Shared by the ReplicaSet
//! and Deployment controllers (availability) and anything else that counts Pods. Feature gates
//! follow v1.34's defaults: PodDeletionCost (beta, on) and LogarithmicScaleDown (GA, locked on)
//! are always applied.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::cached_pod::{CachedPod, CachedPodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The annotation whose integer value orders Pods of equal phase and readiness on scale-down
/// (lower cost is deleted first).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// `namespace/name`: the key expectations track deletions by (upstream's `PodKey`).
pub fn pod_key(pod: &CachedPod) -> String {
    super::informer::key_of(pod)
}

/// Whether the Pod counts towards replicas (CTL-12): not Succeeded, not Failed and not being
/// deleted. Upstream's rule includes the deletionTimestamp: a terminating Pod is already replaced.
pub fn is_pod_active(pod: &CachedPod) -> bool {
    !matches!(pod.phase(), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

/// Whether the Pod is being deleted but has not terminated (`IsPodTerminating`).
pub fn is_pod_terminating(pod: &CachedPod) -> bool {
    !matches!(pod.phase(), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_some()
}

/// The active Pods, in their order (`FilterActivePods`, CTL-12).
pub fn filter_active_pods(pods: &[Arc<CachedPod>]) -> Vec<Arc<CachedPod>> {
    pods.iter().filter(|p| is_pod_active(p)).cloned().collect()
}

/// The Pod's first `Ready` condition (upstream reads the first one of that type).
pub fn ready_condition(pod: &CachedPod) -> Option<&CachedPodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The Ready condition is True (`IsPodReady`).
pub fn is_pod_ready(pod: &CachedPod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// How long until a Pod that has just turned Ready (`old` not Ready, `cur` Ready) is available,
/// which upstream's Pod update handlers queue its owner again after: `min_ready_seconds`, or
/// `None` when it did not just turn Ready or `min_ready_seconds` is 0.
pub fn available_after(
    old: &CachedPod,
    cur: &CachedPod,
    min_ready_seconds: i32,
) -> Option<std::time::Duration> {
    (!is_pod_ready(old) && is_pod_ready(cur) && min_ready_seconds > 0)
        .then(|| std::time::Duration::from_secs(min_ready_seconds as u64))
}

/// Ready for at least `min_ready_seconds` at `now` (`IsPodAvailable`): with 0 every ready Pod is
/// available; otherwise the Ready condition's lastTransitionTime must be set and at least that
/// long ago.
pub fn is_pod_available(pod: &CachedPod, min_ready_seconds: i32, now: Timestamp) -> bool {
    if !is_pod_ready(pod) {
        return false;
    }
    if min_ready_seconds == 0 {
        return true;
    }
    let Some(since) = ready_condition(pod).and_then(|c| c.last_transition_time.as_ref()) else {
        return false;
    };
    since.0 + secs(min_ready_seconds) <= now
}

fn secs(s: i32) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(i64::from(s))
}

/// The `controller.kubernetes.io/pod-deletion-cost` value; missing or invalid is 0, as upstream
/// (`GetDeletionCostFromPodAnnotations`: a 32-bit decimal integer without a plus sign or leading
/// zeros).
pub fn deletion_cost(pod: &CachedPod) -> i32 {
    let Some(v) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST))
    else {
        return 0;
    };
    let valid_first = match v.as_bytes().first() {
        Some(b'-') | Some(b'1'..=b'9') => true,
        Some(b'0') => v == "0",
        _ => false,
    };
    if !valid_first {
        return 0;
    }
    v.parse::<i32>().unwrap_or(0)
}

/// Highest restart count among the regular containers, then among the sidecars (init containers
/// with restartPolicy Always), as upstream's `maxContainerRestarts`.
pub fn max_container_restarts(pod: &CachedPod) -> (i32, i32) {
    let Some(status) = pod.status.as_ref() else {
        return (0, 0);
    };
    let regular = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .fold(0, i32::max);
    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter(|c| sidecars.contains(&c.name.as_str()))
        .map(|c| c.restart_count)
        .fold(0, i32::max);
    (regular, sidecar)
}

fn node_name(pod: &CachedPod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

fn phase_ordinal(pod: &CachedPod) -> u8 {
    // Upstream's map has Pending 0, Unknown 1, Running 2; any other phase reads as 0.
    match pod.phase() {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

/// The ready time used by the ranking: the Ready=True condition's lastTransitionTime (None when
/// not ready or unset: Go's zero time).
fn ready_time(pod: &CachedPod) -> Option<&Timestamp> {
    if !is_pod_ready(pod) {
        return None;
    }
    ready_condition(pod)?
        .last_transition_time
        .as_ref()
        .map(|t| &t.0)
}

fn creation_time(pod: &CachedPod) -> Option<&Timestamp> {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t: &Time| &t.0)
}

/// `afterOrZero`: t1 is after t2, a zero (unset) time being after any set one.
fn after_or_zero(t1: Option<&Timestamp>, t2: Option<&Timestamp>) -> bool {
    match (t1, t2) {
        (Some(a), Some(b)) => a > b,
        (a, _) => a.is_none(),
    }
}

/// `logarithmicRankDiff`: the difference of floor(log2(age in nanoseconds)) of both times.
fn logarithmic_rank_diff(t1: &Timestamp, t2: &Timestamp, now: Timestamp) -> i64 {
    let rank = |t: &Timestamp| {
        let d = now.as_nanosecond() - t.as_nanosecond();
        if d > 0 {
            (d as f64).log2() as i64
        } else {
            -1
        }
    };
    rank(t1) - rank(t2)
}

/// One Pod with its rank (active related Pods on its node) for the scale-down ordering.
#[derive(Debug, Clone, Copy)]
pub struct Ranked<'a> {
    /// The Pod.
    pub pod: &'a CachedPod,
    /// Active related Pods co-located on its node.
    pub rank: usize,
}

/// Whether `a` should be deleted before `b` (RS-6, upstream v1.34 `ActivePodsWithRanks.Less`):
/// 1. unassigned before assigned; 2. Pending < Unknown < Running; 3. not ready before ready;
/// 4. lower pod-deletion-cost first; 5. higher rank (more co-located related Pods) first;
/// 6. both ready: ready more recently first, compared on a log2 scale of the time since `now`
///    (equal buckets: lower UID first); 7. more container restarts first (then sidecar restarts);
/// 8. created more recently first, log2 scale likewise. `now = None` compares times linearly.
pub fn deletion_less(a: Ranked<'_>, b: Ranked<'_>, now: Option<Timestamp>) -> bool {
    let (pa, pb) = (a.pod, b.pod);
    let (na, nb) = (node_name(pa), node_name(pb));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return na.is_empty();
    }
    if phase_ordinal(pa) != phase_ordinal(pb) {
        return phase_ordinal(pa) < phase_ordinal(pb);
    }
    let (ra, rb) = (is_pod_ready(pa), is_pod_ready(pb));
    if ra != rb {
        return !ra;
    }
    let (ca, cb) = (deletion_cost(pa), deletion_cost(pb));
    if ca != cb {
        return ca < cb;
    }
    if a.rank != b.rank {
        return a.rank > b.rank;
    }
    let uid_less = || pa.metadata.uid < pb.metadata.uid;
    if ra && rb {
        let (ta, tb) = (ready_time(pa), ready_time(pb));
        if ta != tb {
            return match (ta, tb, now) {
                (Some(x), Some(y), Some(now)) => match logarithmic_rank_diff(x, y, now) {
                    0 => uid_less(),
                    d => d < 0,
                },
                _ => after_or_zero(ta, tb),
            };
        }
    }
    let (ra, rb) = (max_container_restarts(pa), max_container_restarts(pb));
    if ra.0 != rb.0 {
        return ra.0 > rb.0;
    }
    if ra.1 != rb.1 {
        return ra.1 > rb.1;
    }
    let (ta, tb) = (creation_time(pa), creation_time(pb));
    if ta != tb {
        return match (ta, tb, now) {
            (Some(x), Some(y), Some(now)) => match logarithmic_rank_diff(x, y, now) {
                0 => uid_less(),
                d => d < 0,
            },
            _ => after_or_zero(ta, tb),
        };
    }
    false
}

/// For each of `pods`, the number of active `related` Pods on the same node (unassigned Pods
/// share the empty node name, as upstream's `getPodsRankedByRelatedPodsOnSameNode`).
pub fn colocation_ranks(pods: &[Arc<CachedPod>], related: &[Arc<CachedPod>]) -> Vec<usize> {
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for p in related.iter().filter(|p| is_pod_active(p)) {
        *on_node.entry(node_name(p)).or_default() += 1;
    }
    pods.iter()
        .map(|p| on_node.get(node_name(p)).copied().unwrap_or(0))
        .collect()
}

/// Sorts `pods` (with their `ranks`) into deletion order by [`deletion_less`]. A stable merge
/// sort that tolerates the comparison not being a total order (upstream's mixes exact and
/// bucketed time comparisons); Pods the comparison cannot tell apart keep their input order,
/// where upstream's unstable sort leaves them in an arbitrary one.
pub fn sort_for_deletion(pods: &mut [Arc<CachedPod>], ranks: &[usize], now: Option<Timestamp>) {
    let mut items: Vec<(Arc<CachedPod>, usize)> = pods
        .iter()
        .cloned()
        .zip(ranks.iter().copied().chain(std::iter::repeat(0)))
        .collect();
    merge_sort(
        &mut items,
        &|x: &(Arc<CachedPod>, usize), y: &(Arc<CachedPod>, usize)| {
            let rx = Ranked {
                pod: &x.0,
                rank: x.1,
            };
            let ry = Ranked {
                pod: &y.0,
                rank: y.1,
            };
            if deletion_less(rx, ry, now) {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        },
    );
    for (slot, (p, _)) in pods.iter_mut().zip(items) {
        *slot = p;
    }
}

/// Top-down merge sort taking `b` before `a` only when `cmp(b, a)` is Less: stable and total
/// whatever the comparison returns.
fn merge_sort<T: Clone>(v: &mut [T], cmp: &dyn Fn(&T, &T) -> Ordering) {
    if v.len() <= 1 {
        return;
    }
    let mid = v.len() / 2;
    merge_sort(&mut v[..mid], cmp);
    merge_sort(&mut v[mid..], cmp);
    let (left, right) = (v[..mid].to_vec(), v[mid..].to_vec());
    let (mut i, mut j) = (0, 0);
    for slot in v.iter_mut() {
        let take_right =
            i == left.len() || (j < right.len() && cmp(&right[j], &left[i]) == Ordering::Less);
        if take_right {
            *slot = right[j].clone();
            j += 1;
        } else {
            *slot = left[i].clone();
            i += 1;
        }
    }
}

/// The `n` Pods to delete from `active` (RS-5): all of them when `n` covers them (no sort), else
/// the first `n` in the RS-6 order, ranked against `related` (RS-7).
pub fn get_pods_to_delete(
    mut active: Vec<Arc<CachedPod>>,
    related: &[Arc<CachedPod>],
    n: usize,
    now: Timestamp,
) -> Vec<Arc<CachedPod>> {
    if n < active.len() {
        let ranks = colocation_ranks(&active, related);
        sort_for_deletion(&mut active, &ranks, Some(now));
    }
    active.truncate(n);
    active
}

/// Time until a ready, not yet available Pod becomes available at `now` (None when it is not
/// ready, has no ready time, or is available already).
fn next_check(pod: &CachedPod, min_ready_seconds: i32, now: Timestamp) -> Option<Duration> {
    if min_ready_seconds <= 0 || !is_pod_ready(pod) {
        return None;
    }
    let since = ready_condition(pod)?.last_transition_time.as_ref()?;
    let at = since.0 + secs(min_ready_seconds);
    let left = at.as_nanosecond() - now.as_nanosecond();
    (left > 0).then(|| Duration::from_nanos(left as u64))
}

/// When to look again for Pods turning available (`FindMinNextPodAvailabilityCheck`): the Pod
/// closest to availability as of the status evaluation at `evaluated_at`, its remaining time
/// recomputed at `now` (zero when already past).
pub fn next_availability_check(
    pods: &[Arc<CachedPod>],
    min_ready_seconds: i32,
    evaluated_at: Timestamp,
    now: Timestamp,
) -> Option<Duration> {
    let mut best: Option<(Duration, &CachedPod)> = None;
    for p in pods {
        if let Some(d) = next_check(p, min_ready_seconds, evaluated_at) {
            if best.is_none_or(|(b, _)| d < b) {
                best = Some((d, p));
            }
        }
    }
    let (_, pod) = best?;
    Some(next_check(pod, min_ready_seconds, now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-01-01T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    /// A Pod from a compact description: node ("" = unassigned), phase, ready since (None = not
    /// ready), created at, restarts, extra metadata.
    struct P {
        name: &'static str,
        node: &'static str,
        phase: &'static str,
        ready_since: Option<&'static str>,
        created: &'static str,
        restarts: i32,
        cost: Option<&'static str>,
    }

    const BASE: P = P {
        name: "p",
        node: "n1",
        phase: "Running",
        ready_since: Some("2026-01-01T00:00:00Z"),
        created: "2026-01-01T00:00:00Z",
        restarts: 0,
        cost: None,
    };

    fn pod(p: P) -> Arc<CachedPod> {
        let mut meta = json!({"name": p.name, "namespace": "ns", "uid": format!("uid-{}", p.name),
                              "creationTimestamp": p.created});
        if let Some(c) = p.cost {
            meta["annotations"] = json!({POD_DELETION_COST: c});
        }
        let ready = match p.ready_since {
            Some(t) => json!({"type": "Ready", "status": "True", "lastTransitionTime": t}),
            None => json!({"type": "Ready", "status": "False"}),
        };
        let mut spec = json!({"containers": [{"name": "c", "image": "x"}]});
        if !p.node.is_empty() {
            spec["nodeName"] = json!(p.node);
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": meta,
                "spec": spec,
                "status": {"phase": p.phase, "conditions": [ready],
                           "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": true,
                                                  "restartCount": p.restarts}]}
            }))
            .unwrap(),
        )
    }

    fn pod_json(v: serde_json::Value) -> CachedPod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn active_and_terminating_pods() {
        let deleting = json!("2026-01-01T00:00:00Z");
        let cases = [
            (
                "CTL-12 running is active",
                json!({}),
                "Running",
                true,
                false,
            ),
            (
                "CTL-12 pending is active",
                json!({}),
                "Pending",
                true,
                false,
            ),
            ("CTL-12 no phase is active", json!({}), "", true, false),
            (
                "CTL-12 succeeded is not active",
                json!({}),
                "Succeeded",
                false,
                false,
            ),
            (
                "CTL-12 failed is not active",
                json!({}),
                "Failed",
                false,
                false,
            ),
            (
                "CTL-12 deletionTimestamp is not active (upstream)",
                json!({"deletionTimestamp": deleting}),
                "Running",
                false,
                true,
            ),
            (
                "CTL-12 terminated and deleted is not terminating",
                json!({"deletionTimestamp": deleting}),
                "Failed",
                false,
                false,
            ),
        ];
        for (name, extra, phase, active, terminating) in cases {
            let mut meta = json!({"name": "p", "namespace": "ns"});
            json_patch::merge(&mut meta, &extra);
            let p = pod_json(json!({"metadata": meta, "status": {"phase": phase}}));
            assert_eq!(is_pod_active(&p), active, "{name}");
            assert_eq!(is_pod_terminating(&p), terminating, "{name}");
        }
        let pods = vec![
            pod(P { name: "a", ..BASE }),
            pod(P {
                name: "b",
                phase: "Succeeded",
                ..BASE
            }),
            pod(P { name: "c", ..BASE }),
        ];
        let names: Vec<_> = filter_active_pods(&pods)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "c"], "CTL-12 filter keeps order");
    }

    #[test]
    fn deletion_cost_parsing() {
        let cases = [
            ("RS-6 cost missing is 0", None, 0),
            ("RS-6 cost positive", Some("10"), 10),
            ("RS-6 cost negative", Some("-5"), -5),
            ("RS-6 cost zero", Some("0"), 0),
            ("RS-6 cost plus sign invalid = 0", Some("+10"), 0),
            ("RS-6 cost leading zero invalid = 0", Some("008"), 0),
            ("RS-6 cost not a number = 0", Some("abc"), 0),
            ("RS-6 cost empty = 0", Some(""), 0),
            ("RS-6 cost beyond int32 = 0", Some("2147483648"), 0),
            ("RS-6 cost int32 max", Some("2147483647"), i32::MAX),
        ];
        for (name, v, want) in cases {
            assert_eq!(deletion_cost(&pod(P { cost: v, ..BASE })), want, "{name}");
        }
    }

    #[test]
    fn availability() {
        let cases = [
            ("not ready is never available", None, 0, false),
            (
                "ready, minReadySeconds 0",
                Some("2026-01-01T11:59:59Z"),
                0,
                true,
            ),
            (
                "ready 10s, min 10s: available",
                Some("2026-01-01T11:59:50Z"),
                10,
                true,
            ),
            (
                "ready 9s, min 10s: not yet",
                Some("2026-01-01T11:59:51Z"),
                10,
                false,
            ),
        ];
        for (name, since, min, want) in cases {
            let p = pod(P {
                ready_since: since,
                ..BASE
            });
            assert_eq!(is_pod_available(&p, min, now()), want, "{name}");
        }
        let no_time = pod_json(json!({"metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
        assert!(is_pod_available(&no_time, 0, now()));
        assert!(
            !is_pod_available(&no_time, 5, now()),
            "ready without a transition time is not available with minReadySeconds"
        );
    }

    fn ranked(p: &Arc<CachedPod>, rank: usize) -> Ranked<'_> {
        Ranked { pod: p, rank }
    }

    #[test]
    fn ranking_keys_in_order() {
        // Each case: (name, a, rank a, b, rank b): a must go before b, and not the reverse.
        let cases: Vec<(&str, P, usize, P, usize)> = vec![
            (
                "RS-6 1 unassigned before assigned (even if Running and ready)",
                P { node: "", ..BASE },
                0,
                P {
                    phase: "Pending",
                    ready_since: None,
                    ..BASE
                },
                0,
            ),
            (
                "RS-6 2 Pending before Unknown",
                P {
                    phase: "Pending",
                    ..BASE
                },
                0,
                P {
                    phase: "Unknown",
                    ..BASE
                },
                0,
            ),
            (
                "RS-6 2 Unknown before Running",
                P {
                    phase: "Unknown",
                    ..BASE
                },
                0,
                BASE,
                0,
            ),
            (
                "RS-6 3 not ready before ready",
                P {
                    ready_since: None,
                    ..BASE
                },
                0,
                P {
                    cost: Some("-100"),
                    ..BASE
                },
                9,
            ),
            (
                "RS-6 4 lower deletion cost first (before rank)",
                P {
                    cost: Some("-1"),
                    ..BASE
                },
                0,
                BASE,
                5,
            ),
            (
                "RS-6 4 invalid cost counts as 0",
                P {
                    cost: Some("+5"),
                    ..BASE
                },
                0,
                P {
                    cost: Some("1"),
                    ..BASE
                },
                0,
            ),
            ("RS-6 5 higher rank (doubled up) first", BASE, 2, BASE, 1),
            (
                "RS-6 6 ready more recently first (different log2 bucket)",
                P {
                    ready_since: Some("2026-01-01T11:59:00Z"),
                    ..BASE
                },
                1,
                P {
                    ready_since: Some("2026-01-01T10:00:00Z"),
                    restarts: 9,
                    ..BASE
                },
                1,
            ),
            (
                "RS-6 7 more restarts first",
                P {
                    restarts: 3,
                    created: "2025-01-01T00:00:00Z",
                    ..BASE
                },
                0,
                BASE,
                0,
            ),
            (
                "RS-6 8 newer creation first (different log2 bucket)",
                P {
                    created: "2026-01-01T11:00:00Z",
                    ..BASE
                },
                0,
                BASE,
                0,
            ),
        ];
        for (name, a, rank_a, b, rank_b) in cases {
            let (a, b) = (pod(P { name: "a", ..a }), pod(P { name: "b", ..b }));
            assert!(
                deletion_less(ranked(&a, rank_a), ranked(&b, rank_b), Some(now())),
                "{name}: a first"
            );
            assert!(
                !deletion_less(ranked(&b, rank_b), ranked(&a, rank_a), Some(now())),
                "{name}: not b first"
            );
        }
    }

    #[test]
    fn logarithmic_buckets() {
        // Ages 6h and 5h (from NOW) fall in the same log2(ns) bucket (2^44 ns is about 4.9h, 2^45
        // about 9.8h), so the UID decides and restarts are not looked at; a linear comparison
        // (now = None) prefers the more recently ready one.
        let older = "2026-01-01T06:00:00Z";
        let newer = "2026-01-01T07:00:00Z";
        let bucket = |t: &str| {
            let t: Timestamp = t.parse().unwrap();
            ((now().as_nanosecond() - t.as_nanosecond()) as f64).log2() as i64
        };
        assert_eq!(bucket(older), bucket(newer), "test premise: same bucket");
        let cases = [
            (
                "RS-6 6 same ready bucket: lower UID first",
                P {
                    name: "a",
                    ready_since: Some(older),
                    ..BASE
                },
                P {
                    name: "b",
                    ready_since: Some(newer),
                    restarts: 5,
                    ..BASE
                },
                Some(now()),
                true,
            ),
            (
                "RS-6 6 linear without now: more recently ready first",
                P {
                    name: "a",
                    ready_since: Some(older),
                    ..BASE
                },
                P {
                    name: "b",
                    ready_since: Some(newer),
                    ..BASE
                },
                None,
                false,
            ),
            (
                "RS-6 8 same creation bucket: lower UID first",
                P {
                    name: "a",
                    created: older,
                    ..BASE
                },
                P {
                    name: "b",
                    created: newer,
                    ..BASE
                },
                Some(now()),
                true,
            ),
            (
                "RS-6 6 equal ready times fall through to restarts",
                P {
                    name: "b",
                    restarts: 1,
                    ..BASE
                },
                P { name: "a", ..BASE },
                Some(now()),
                true,
            ),
        ];
        for (name, a, b, now, a_first) in cases {
            let (a, b) = (pod(a), pod(b));
            assert_eq!(
                deletion_less(ranked(&a, 0), ranked(&b, 0), now),
                a_first,
                "{name}"
            );
        }
    }

    #[test]
    fn sidecar_restarts_break_ties() {
        let with_sidecar = |name: &str, sidecar: i32| {
            Arc::new(pod_json(json!({
                "metadata": {"name": name, "uid": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n", "containers": [{"name": "c"}],
                         "initContainers": [{"name": "s", "restartPolicy": "Always"}, {"name": "i"}]},
                "status": {"phase": "Running",
                           "containerStatuses": [{"name": "c", "image": "", "imageID": "", "ready": true, "restartCount": 1}],
                           "initContainerStatuses": [
                               {"name": "s", "image": "", "imageID": "", "ready": true, "restartCount": sidecar},
                               {"name": "i", "image": "", "imageID": "", "ready": false, "restartCount": 50}]}
            })))
        };
        let (a, b) = (with_sidecar("b", 3), with_sidecar("a", 1));
        assert_eq!(
            max_container_restarts(&a),
            (1, 3),
            "RS-6 7 plain init containers ignored"
        );
        assert!(
            deletion_less(ranked(&a, 0), ranked(&b, 0), Some(now())),
            "RS-6 7 more sidecar restarts first"
        );
        assert!(!deletion_less(ranked(&b, 0), ranked(&a, 0), Some(now())));
    }

    fn names(pods: &[Arc<CachedPod>]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    }

    #[test]
    fn pods_to_delete() {
        let ready = pod(P {
            name: "ready",
            ..BASE
        });
        let unready = pod(P {
            name: "unready",
            node: "n4",
            ready_since: None,
            ..BASE
        });
        let unscheduled = pod(P {
            name: "unscheduled",
            node: "",
            phase: "Pending",
            ready_since: None,
            ..BASE
        });
        let doubled = pod(P {
            name: "doubled",
            node: "n2",
            ..BASE
        });
        let expensive = pod(P {
            name: "expensive",
            cost: Some("100"),
            node: "n3",
            ..BASE
        });
        let all = vec![
            expensive.clone(),
            ready.clone(),
            doubled.clone(),
            unready.clone(),
            unscheduled.clone(),
        ];
        // Related: the ReplicaSet's own Pods plus a sibling's active Pod on n2 and a terminated
        // one on n1 (terminated Pods do not count towards ranks).
        let sibling = pod(P {
            name: "sibling",
            node: "n2",
            ..BASE
        });
        let dead = pod(P {
            name: "dead",
            phase: "Failed",
            ..BASE
        });
        let mut related = all.clone();
        related.push(sibling);
        related.push(dead);
        let cases: [(&str, usize, Vec<&str>); 5] = [
            ("RS-5 n = 0 deletes nothing", 0, vec![]),
            (
                "RS-6 unscheduled, then not ready, first",
                2,
                vec!["unscheduled", "unready"],
            ),
            (
                "RS-7 doubled up (rank from related Pods) before a lone ready Pod",
                3,
                vec!["unscheduled", "unready", "doubled"],
            ),
            (
                "RS-6 highest deletion cost last",
                4,
                vec!["unscheduled", "unready", "doubled", "ready"],
            ),
            (
                "RS-5 n covers all: no sort, input order",
                5,
                vec!["expensive", "ready", "doubled", "unready", "unscheduled"],
            ),
        ];
        for (name, n, want) in cases {
            let got = get_pods_to_delete(all.clone(), &related, n, now());
            assert_eq!(names(&got), want, "{name}");
        }
        assert_eq!(
            colocation_ranks(&all, &related),
            vec![1, 1, 2, 1, 1],
            "RS-7 ranks: n3 1, n1 1 (dead not counted), n2 2 (with the sibling), n4 1, unassigned 1"
        );
    }

    #[test]
    fn sort_is_total_on_inconsistent_comparisons() {
        // Times straddling a bucket edge with equal ones make upstream's comparison intransitive;
        // the sort must still return every Pod exactly once.
        let times = [
            "2026-01-01T07:00:00Z",
            "2026-01-01T07:00:00Z",
            "2026-01-01T08:00:00Z",
            "2026-01-01T03:00:00Z",
            "2026-01-01T11:59:59Z",
        ];
        let names_in = ["e", "d", "c", "b", "a"];
        let mut pods: Vec<Arc<CachedPod>> = times
            .iter()
            .zip(names_in)
            .enumerate()
            .map(|(i, (t, n))| {
                pod(P {
                    name: n,
                    ready_since: Some(t),
                    restarts: i as i32,
                    ..BASE
                })
            })
            .collect();
        let ranks = vec![0; pods.len()];
        sort_for_deletion(&mut pods, &ranks, Some(now()));
        let mut got = names(&pods);
        assert_eq!(got[0], "a", "RS-6 6 most recently ready first");
        got.sort();
        assert_eq!(got, ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn availability_requeue() {
        let evaluated: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-01-01T12:00:02Z".parse().unwrap();
        let pods = vec![
            pod(P {
                name: "a",
                ready_since: Some("2026-01-01T11:59:55Z"),
                ..BASE
            }),
            pod(P {
                name: "b",
                ready_since: Some("2026-01-01T11:59:58Z"),
                ..BASE
            }),
            pod(P {
                name: "c",
                ready_since: None,
                ..BASE
            }),
        ];
        let cases = [
            ("RS-3 no minReadySeconds: no check", 0, evaluated, None),
            (
                "RS-3 next check: the Pod closest to available",
                10,
                evaluated,
                Some(Duration::from_secs(5)),
            ),
            (
                "RS-3 next check recomputed at the current time",
                10,
                later,
                Some(Duration::from_secs(3)),
            ),
            ("RS-3 all available: no check", 1, evaluated, None),
        ];
        for (name, min, now, want) in cases {
            assert_eq!(
                next_availability_check(&pods, min, evaluated, now),
                want,
                "{name}"
            );
        }
        let past: Timestamp = "2026-01-01T12:01:00Z".parse().unwrap();
        assert_eq!(
            next_availability_check(&pods, 10, evaluated, past),
            Some(Duration::ZERO),
            "RS-3 already past at the current time: check now"
        );
    }
}
