//! podgc's decisions, over upstream's test tables (`gc_controller_test.go`: TestGCTerminated,
//! TestGCOrphaned's pure part, TestGCUnscheduledTerminating, TestGCTerminating) in this project's
//! words, plus the Failed status patch.

use std::collections::{BTreeSet, HashMap};

use serde_json::json;

use super::*;

/// A Pod `name` on `node` (`""`: unscheduled) in `phase` (`""`: none), created `hour` hours after
/// the epoch.
fn pod(name: &str, node: &str, phase: &str, hour: i64) -> Arc<CachedPod> {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "creationTimestamp": Timestamp::from_second(hour * 3600).unwrap().to_string()},
        "spec": {"nodeName": node},
        "status": {},
    });
    if !phase.is_empty() {
        v["status"]["phase"] = json!(phase);
    }
    Arc::new(serde_json::from_value(v).unwrap())
}

fn with(p: Arc<CachedPod>, extra: serde_json::Value) -> Arc<CachedPod> {
    let mut v = serde_json::to_value(p.as_ref()).unwrap();
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn deleting(p: Arc<CachedPod>) -> Arc<CachedPod> {
    with(
        p,
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    )
}

fn names(pods: &[Arc<CachedPod>]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn terminated_pods_above_the_threshold_oldest_and_evicted_first() {
    struct Case {
        name: &'static str,
        /// (name, phase, evicted), created one hour apart in this order.
        pods: &'static [(&'static str, &'static str, bool)],
        threshold: usize,
        deleted: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "Failed a and Succeeded b go, the newest terminated c stays",
            pods: &[
                ("a", "Failed", false),
                ("b", "Succeeded", false),
                ("c", "Failed", false),
            ],
            threshold: 1,
            deleted: &["a", "b"],
        },
        Case {
            name: "threshold 0 turns the collection off",
            pods: &[("a", "Failed", false), ("b", "Succeeded", false)],
            threshold: 0,
            deleted: &[],
        },
        Case {
            name: "a Running Pod is not terminated and does not count",
            pods: &[
                ("a", "Running", false),
                ("b", "Succeeded", false),
                ("c", "Failed", false),
            ],
            threshold: 1,
            deleted: &["b"],
        },
        Case {
            name: "one above the threshold: the oldest goes",
            pods: &[("a", "Failed", false), ("b", "Succeeded", false)],
            threshold: 1,
            deleted: &["a"],
        },
        Case {
            name: "under the threshold: nothing",
            pods: &[("a", "Failed", false), ("b", "Succeeded", false)],
            threshold: 5,
            deleted: &[],
        },
        Case {
            name: "an evicted Pod goes first, however new",
            pods: &[
                ("a", "Failed", false),
                ("b", "Succeeded", false),
                ("c", "Failed", true),
            ],
            threshold: 1,
            deleted: &["c", "a"],
        },
        Case {
            name: "the evicted Pod alone when one must go",
            pods: &[
                ("a", "Running", false),
                ("b", "Succeeded", false),
                ("c", "Failed", true),
            ],
            threshold: 1,
            deleted: &["c"],
        },
    ];
    for c in cases {
        let pods: Vec<_> = c
            .pods
            .iter()
            .enumerate()
            .map(|(i, (name, phase, evicted))| {
                let p = pod(name, "node", phase, i as i64 + 1);
                if *evicted {
                    with(p, json!({"status": {"reason": "Evicted"}}))
                } else {
                    p
                }
            })
            .collect();
        assert_eq!(
            names(&terminated_to_delete(&pods, c.threshold)),
            c.deleted,
            "{}",
            c.name
        );
    }
}

#[test]
fn collection_order_is_eviction_then_creation_then_name() {
    let mut pods = vec![
        pod("z-same-time", "n", "Failed", 5),
        pod("a-same-time", "n", "Failed", 5),
        pod("old", "n", "Succeeded", 1),
        with(
            pod("evicted-new", "n", "Failed", 9),
            json!({"status": {"reason": "Evicted"}}),
        ),
        // Evicted needs Failed: a Succeeded Pod with that reason is not.
        with(
            pod("succeeded-evicted-reason", "n", "Succeeded", 2),
            json!({"status": {"reason": "Evicted"}}),
        ),
    ];
    sort_for_collection(&mut pods);
    assert_eq!(
        names(&pods),
        [
            "evicted-new",
            "old",
            "succeeded-evicted-reason",
            "a-same-time",
            "z-same-time"
        ]
    );
    // A Pod without a phase counts as terminated, as upstream's isPodTerminated says.
    assert!(is_terminated(&pod("x", "n", "", 1)));
    for phase in ["Pending", "Running", "Unknown"] {
        assert!(!is_terminated(&pod("x", "n", phase, 1)), "{phase}");
    }
}

#[test]
fn orphans_are_the_pods_of_nodes_missing_from_the_cache_and_confirmed_gone() {
    struct Case {
        name: &'static str,
        cached_nodes: &'static [&'static str],
        /// What the live read after the quarantine says is gone.
        gone: &'static [&'static str],
        pods: Vec<Arc<CachedPod>>,
        quarantined: &'static [&'static str],
        deleted: &'static [&'static str],
        patched: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "nodes in the cache: nothing quarantined",
            cached_nodes: &["existing1", "existing2"],
            gone: &[],
            pods: vec![
                pod("a", "existing1", "Running", 1),
                pod("b", "existing2", "Failed", 1),
                pod("c", "existing2", "Succeeded", 1),
            ],
            quarantined: &[],
            deleted: &[],
            patched: &[],
        },
        Case {
            name: "nodes only in the API server: quarantined, then found, nothing deleted",
            cached_nodes: &[],
            gone: &[],
            pods: vec![
                pod("a", "existing1", "Running", 1),
                pod("b", "existing2", "Failed", 1),
            ],
            quarantined: &["existing1", "existing2"],
            deleted: &[],
            patched: &[],
        },
        Case {
            name: "no nodes: every Pod of the deleted one goes, the running one marked Failed",
            cached_nodes: &[],
            gone: &["deleted"],
            pods: vec![
                pod("a", "deleted", "Failed", 1),
                pod("b", "deleted", "Succeeded", 1),
                pod("c", "deleted", "Running", 1),
            ],
            quarantined: &["deleted"],
            deleted: &["a", "b", "c"],
            patched: &["c"],
        },
        Case {
            name: "some nodes missing",
            cached_nodes: &["existing"],
            gone: &["deleted"],
            pods: vec![
                pod("a", "deleted", "Failed", 1),
                pod("b", "existing", "Failed", 1),
                pod("c", "deleted", "Succeeded", 1),
                pod("d", "deleted", "Running", 1),
            ],
            quarantined: &["deleted"],
            deleted: &["a", "c", "d"],
            patched: &["d"],
        },
        Case {
            name: "unscheduled Pods name no node: never orphans",
            cached_nodes: &[],
            gone: &[],
            pods: vec![pod("a", "", "Pending", 1)],
            quarantined: &[],
            deleted: &[],
            patched: &[],
        },
    ];
    for c in cases {
        let cached: BTreeSet<&str> = c.cached_nodes.iter().copied().collect();
        let missing = missing_nodes(&c.pods, |n| cached.contains(n));
        assert_eq!(
            missing.iter().cloned().collect::<Vec<_>>(),
            c.quarantined,
            "{}",
            c.name
        );
        let gone: BTreeSet<String> = c.gone.iter().map(|s| s.to_string()).collect();
        let orphans = orphaned(&c.pods, &gone);
        assert_eq!(sorted(names(&orphans)), c.deleted, "{}", c.name);
        let patched: Vec<String> = orphans
            .iter()
            .filter(|p| failed_status_patch(p, Some(&NODE_GONE), Timestamp::now()).is_some())
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(sorted(patched), c.patched, "{}", c.name);
    }
}

#[test]
fn unscheduled_terminating_pods_in_any_phase_go() {
    let pods = vec![
        deleting(pod("a", "", "Failed", 1)),
        deleting(pod("b", "", "Succeeded", 1)),
        deleting(pod("c", "", "Running", 1)),
        // Not terminating, or scheduled: left alone.
        pod("d", "", "Failed", 1),
        pod("e", "node", "Succeeded", 1),
        deleting(pod("f", "node", "Running", 1)),
    ];
    let victims = unscheduled_terminating(&pods);
    assert_eq!(names(&victims), ["a", "b", "c"]);
    let patched: Vec<_> = victims
        .iter()
        .filter(|p| failed_status_patch(p, None, Timestamp::now()).is_some())
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(patched, ["c"]);
}

fn node(name: &str, ready: &str, taint_effects: &[&str]) -> Arc<Node> {
    let taints: Vec<_> = taint_effects
        .iter()
        .map(|e| json!({"key": OUT_OF_SERVICE_TAINT, "value": "any-value", "effect": e}))
        .collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap(),
    )
}

#[test]
fn terminating_pods_on_out_of_service_nodes_go() {
    // Upstream's table: worker-0 and 5 are not Ready with a NoExecute out-of-service taint, 3 and
    // 4 with the taint under other effects (the key is what counts), 1 is not Ready untainted, 2
    // is Ready.
    let nodes: HashMap<String, Arc<Node>> = [
        node("worker-0", "False", &["NoExecute"]),
        node("worker-1", "False", &[]),
        node("worker-2", "True", &[]),
        node("worker-3", "False", &["NoSchedule"]),
        node("worker-4", "False", &["PreferNoSchedule"]),
        node("worker-5", "False", &["NoExecute"]),
    ]
    .into_iter()
    .map(|n| (n.metadata.name.clone().unwrap(), n))
    .collect();
    let mut pods = Vec::new();
    for (i, worker) in [
        "worker-0", "worker-1", "worker-2", "worker-3", "worker-4", "worker-5",
    ]
    .iter()
    .enumerate()
    {
        let n = i + 1;
        pods.push(pod(&format!("a{n}"), worker, "", 1));
        pods.push(deleting(pod(&format!("b{n}"), worker, "", 1)));
        pods.push(pod(&format!("c{n}"), worker, "Pending", 1));
        pods.push(pod(&format!("d{n}"), worker, "Running", 1));
        pods.push(pod(&format!("e{n}"), worker, "Unknown", 1));
    }
    // A terminating Pod on a Node the cache lacks is skipped.
    pods.push(deleting(pod("x", "unknown-node", "Running", 1)));
    let victims = terminating_out_of_service(&pods, |n| nodes.get(n).cloned());
    assert_eq!(sorted(names(&victims)), ["b1", "b4", "b5", "b6"]);
    // Each without a terminal phase: each marked Failed first.
    assert!(victims
        .iter()
        .all(|p| failed_status_patch(p, None, Timestamp::now()).is_some()));
}

#[test]
fn failed_status_patch_as_upstream_writes_it() {
    let now: Timestamp = "2026-03-04T05:06:07Z".parse().unwrap();
    let running = with(
        pod("p", "gone", "Running", 1),
        json!({"metadata": {"generation": 2}}),
    );
    assert_eq!(
        failed_status_patch(&running, Some(&NODE_GONE), now).unwrap(),
        json!({
            "metadata": {"uid": "uid-p"},
            "status": {"phase": "Failed", "observedGeneration": 2, "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists",
                "lastTransitionTime": "2026-03-04T05:06:07Z", "observedGeneration": 2}]}
        })
    );
    // A DisruptionTarget already True keeps its transition time (upstream's UpdatePodCondition).
    let disrupted = with(
        running.clone(),
        json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );
    let patch = failed_status_patch(&disrupted, Some(&NODE_GONE), now).unwrap();
    assert_eq!(
        patch["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    // No condition, no generation: the phase and the precondition only.
    assert_eq!(
        failed_status_patch(&pod("q", "", "Pending", 1), None, now).unwrap(),
        json!({"metadata": {"uid": "uid-q"}, "status": {"phase": "Failed"}})
    );
    for phase in ["Succeeded", "Failed"] {
        assert_eq!(
            failed_status_patch(&pod("t", "gone", phase, 1), Some(&NODE_GONE), now),
            None,
            "a {phase} Pod is deleted as it is"
        );
    }
}
