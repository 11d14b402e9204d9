//! Named cases for the DaemonSet plan, each after the rule ID (DS-*) it proves; expected values
//! are those of kube-controller-manager v1.34.4's `pkg/controller/daemon` for the same inputs.

use super::*;
use crate::runtime::cached_pod::CachedPod;
use serde_json::json;

const NOW: &str = "2026-01-01T12:00:00Z";
const HASH: &str = "h2";

fn clock() -> Clock {
    Clock {
        instant: Instant::now(),
        now: NOW.parse().unwrap(),
    }
}

fn ds_with(extra: Value) -> DaemonSet {
    let mut v = json!({
        "metadata": {"name": "agent", "namespace": "ns", "uid": "ds-uid", "generation": 2,
                     "annotations": {TEMPLATE_GENERATION_ANNOTATION: "2"}},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"containers": [{"name": "c", "image": "agent:2"}]}},
                 "updateStrategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                 "revisionHistoryLimit": 10},
        "status": {"observedGeneration": 2, "currentNumberScheduled": 0,
                   "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn ds() -> DaemonSet {
    ds_with(json!({}))
}

fn surge_ds(surge: Value) -> DaemonSet {
    ds_with(
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": surge}}}}),
    )
}

fn node_with(name: &str, extra: Value) -> Arc<Node> {
    let mut v = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn node(name: &str) -> Arc<Node> {
    node_with(name, json!({}))
}

fn tainted(name: &str, key: &str, effect: &str) -> Arc<Node> {
    node_with(
        name,
        json!({"spec": {"taints": [{"key": key, "effect": effect}]}}),
    )
}

/// A daemon Pod on `node`: `hash` its revision label, `ready_since` None = not ready, `created`
/// its creation time.
fn pod_full(
    name: &str,
    node: &str,
    hash: &str,
    ready_since: Option<&str>,
    extra: Value,
) -> Arc<CachedPod> {
    let cond = crate::runtime::testing::ready_condition(ready_since);
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"app": "agent", REVISION_HASH_LABEL: hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                          "uid": "ds-uid", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "agent"}]},
        "status": {"phase": "Running", "conditions": [cond]}
    });
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn ready(name: &str, node: &str, hash: &str) -> Arc<CachedPod> {
    pod_full(name, node, hash, Some("2026-01-01T00:00:00Z"), json!({}))
}

fn unready(name: &str, node: &str, hash: &str) -> Arc<CachedPod> {
    pod_full(name, node, hash, None, json!({}))
}

fn by_node(pods: &[Arc<CachedPod>]) -> NodePods {
    nodes_to_daemon_pods(pods, false)
}

fn backoff() -> FailedPodsBackoff {
    FailedPodsBackoff::new(FAILED_POD_BACKOFF_INITIAL, FAILED_POD_BACKOFF_MAX)
}

#[test]
fn ds4_node_should_run_daemon_pod() {
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        node: Arc<Node>,
        want: (bool, bool),
    }
    let cases = [
        Case {
            name: "DS-1 a plain node runs the Pod",
            ds: ds(),
            node: node("n1"),
            want: (true, true),
        },
        Case {
            name: "DS-4 nodeSelector not matched: no Pod, none kept",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeSelector": {"disk": "ssd"}}}}})),
            node: node("n1"),
            want: (false, false),
        },
        Case {
            name: "DS-4 nodeSelector matched",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeSelector": {"disk": "ssd"}}}}})),
            node: node_with("n1", json!({"metadata": {"labels": {"disk": "ssd"}}})),
            want: (true, true),
        },
        Case {
            name: "DS-4 required node affinity not matched",
            ds: ds_with(
                json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}}}),
            ),
            node: node_with("n1", json!({"metadata": {"labels": {"zone": "b"}}})),
            want: (false, false),
        },
        Case {
            name: "DS-4 required node affinity by metadata.name matchFields",
            ds: ds_with(
                json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}}}),
            ),
            node: node("n1"),
            want: (true, true),
        },
        Case {
            name: "DS-4 template nodeName names another node",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeName": "n2"}}}})),
            node: node("n1"),
            want: (false, false),
        },
        Case {
            name: "DS-4 untolerated NoSchedule taint: no new Pod, the running one stays",
            ds: ds(),
            node: tainted("n1", "dedicated", "NoSchedule"),
            want: (false, true),
        },
        Case {
            name: "DS-4 untolerated NoExecute taint: no Pod and the running one goes",
            ds: ds(),
            node: tainted("n1", "dedicated", "NoExecute"),
            want: (false, false),
        },
        Case {
            name: "DS-4 PreferNoSchedule taint is ignored",
            ds: ds(),
            node: tainted("n1", "dedicated", "PreferNoSchedule"),
            want: (true, true),
        },
        Case {
            name: "DS-4 a taint the template tolerates",
            ds: ds_with(json!({"spec": {"template": {"spec": {"tolerations": [
                {"key": "dedicated", "operator": "Exists"}]}}}})),
            node: tainted("n1", "dedicated", "NoExecute"),
            want: (true, true),
        },
        Case {
            name: "DS-4 added toleration: not-ready NoExecute",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/not-ready", "NoExecute"),
            want: (true, true),
        },
        Case {
            name: "DS-4 added toleration: unreachable NoExecute",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/unreachable", "NoExecute"),
            want: (true, true),
        },
        Case {
            name: "DS-4 not-ready NoSchedule is not tolerated (only NoExecute is added)",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/not-ready", "NoSchedule"),
            want: (false, true),
        },
        Case {
            name: "DS-4 added toleration: disk-pressure NoSchedule",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/disk-pressure", "NoSchedule"),
            want: (true, true),
        },
        Case {
            name: "DS-4 added toleration: memory-pressure NoSchedule",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/memory-pressure", "NoSchedule"),
            want: (true, true),
        },
        Case {
            name: "DS-4 added toleration: pid-pressure NoSchedule",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/pid-pressure", "NoSchedule"),
            want: (true, true),
        },
        Case {
            name: "DS-4 added toleration: unschedulable NoSchedule (cordoned nodes keep daemons)",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/unschedulable", "NoSchedule"),
            want: (true, true),
        },
        Case {
            name: "DS-4 network-unavailable is not tolerated without hostNetwork",
            ds: ds(),
            node: tainted("n1", "node.kubernetes.io/network-unavailable", "NoSchedule"),
            want: (false, true),
        },
        Case {
            name: "DS-4 added toleration: network-unavailable for hostNetwork Pods",
            ds: ds_with(json!({"spec": {"template": {"spec": {"hostNetwork": true}}}})),
            node: tainted("n1", "node.kubernetes.io/network-unavailable", "NoSchedule"),
            want: (true, true),
        },
    ];
    for c in cases {
        assert_eq!(
            node_should_run_daemon_pod(&c.node, &c.ds),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn ds5_daemon_tolerations_added_or_updated() {
    struct Case {
        name: &'static str,
        spec: Value,
        want_len: usize,
        check: fn(&[Toleration]) -> bool,
    }
    let cases = [
        Case {
            name: "DS-5 six tolerations added to a Pod without any",
            spec: json!({"containers": []}),
            want_len: 6,
            check: |t| t.iter().all(|t| t.operator.as_deref() == Some("Exists")),
        },
        Case {
            name: "DS-5 seven with hostNetwork (network-unavailable)",
            spec: json!({"containers": [], "hostNetwork": true}),
            want_len: 7,
            check: |t| {
                t.iter()
                    .any(|t| t.key.as_deref() == Some("node.kubernetes.io/network-unavailable"))
            },
        },
        Case {
            name: "DS-5 a matching toleration with tolerationSeconds is replaced, not duplicated",
            spec: json!({"containers": [], "tolerations": [{"key": "node.kubernetes.io/not-ready",
                "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}),
            want_len: 6,
            check: |t| t.iter().all(|t| t.toleration_seconds.is_none()),
        },
        Case {
            name: "DS-5 an unrelated user toleration is kept first",
            spec: json!({"containers": [], "tolerations": [{"key": "x", "operator": "Exists"}]}),
            want_len: 7,
            check: |t| t[0].key.as_deref() == Some("x"),
        },
    ];
    for c in cases {
        let mut spec: PodSpec = serde_json::from_value(c.spec).unwrap();
        add_daemon_tolerations(&mut spec);
        let t = spec.tolerations.unwrap_or_default();
        assert_eq!(t.len(), c.want_len, "{}: {t:?}", c.name);
        assert!((c.check)(&t), "{}: {t:?}", c.name);
    }
}

#[test]
fn ds5_node_affinity_pins_the_pod_by_metadata_name() {
    let term = |v: Value| -> Option<Affinity> { serde_json::from_value(v).unwrap() };
    let pinned = json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]});
    struct Case {
        name: &'static str,
        affinity: Option<Affinity>,
        want: Value,
    }
    let cases = [
        Case {
            name: "DS-5 no affinity: a required matchFields metadata.name term",
            affinity: None,
            want: json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": pinned}}),
        },
        Case {
            name: "DS-5 pod anti-affinity kept, node affinity added",
            affinity: term(json!({"podAntiAffinity": {}})),
            want: json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": pinned},
                         "podAntiAffinity": {}}),
        },
        Case {
            name: "DS-5 user's required terms replaced, preferred terms kept",
            affinity: term(json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                    "matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}]}})),
            want: json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": pinned,
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                    "matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}]}}),
        },
    ];
    for c in cases {
        let got = serde_json::to_value(replace_node_name_affinity(c.affinity, "n1")).unwrap();
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn ds5_target_node_name() {
    let with_affinity = |values: Value| {
        Arc::new(
            serde_json::from_value::<CachedPod>(json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": values}]}]}}}}}))
            .unwrap(),
        )
    };
    let cases: Vec<(&str, Arc<CachedPod>, Option<&str>)> = vec![
        (
            "DS-5 a bound Pod: its nodeName",
            ready("p", "n3", HASH),
            Some("n3"),
        ),
        (
            "DS-5 a pending Pod: its matchFields node",
            with_affinity(json!(["n2"])),
            Some("n2"),
        ),
        (
            "DS-5 two values: no target (skipped)",
            with_affinity(json!(["n1", "n2"])),
            None,
        ),
        (
            "DS-5 no nodeName and no affinity: no target",
            Arc::new(serde_json::from_value(json!({"spec": {"containers": []}})).unwrap()),
            None,
        ),
    ];
    for (name, pod, want) in cases {
        assert_eq!(target_node_name(&pod).as_deref(), want, "{name}");
    }
}

#[test]
fn ds5_new_pod_carries_labels_tolerations_affinity_and_owner() {
    let d = ds();
    let t = create_pod_template(&template(&d), template_generation(&d), HASH);
    let pod = new_daemon_pod(&d, &t, "n7").unwrap();
    let labels = pod.labels();
    assert_eq!(
        labels.get(REVISION_HASH_LABEL).map(String::as_str),
        Some(HASH),
        "DS-3 hash label"
    );
    assert_eq!(
        labels.get(TEMPLATE_GENERATION_LABEL).map(String::as_str),
        Some("2"),
        "DS-5 generation label"
    );
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
    let owner = &pod.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("DaemonSet", Some(true))
    );
    assert_eq!(
        target_node_name(&CachedPod::from(&pod)).as_deref(),
        Some("n7"),
        "DS-5 pinned to its node"
    );
    assert_eq!(
        pod.spec
            .as_ref()
            .unwrap()
            .tolerations
            .as_ref()
            .unwrap()
            .len(),
        6
    );
    let no_labels = ds_with(json!({"spec": {"template": {"metadata": {"labels": null}}}}));
    let err = new_daemon_pod(&no_labels, &template(&no_labels), "n1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec.template.metadata.labels"), "{err}");
}

#[test]
fn ds4_manage_per_node() {
    let failed = |name: &str, node: &str| {
        pod_full(
            name,
            node,
            HASH,
            None,
            json!({"status": {"phase": "Failed"}}),
        )
    };
    let succeeded = |name: &str, node: &str| {
        pod_full(
            name,
            node,
            HASH,
            None,
            json!({"status": {"phase": "Succeeded"}}),
        )
    };
    let older = |name: &str, node: &str, t: &str| {
        pod_full(
            name,
            node,
            HASH,
            Some("2026-01-01T00:00:00Z"),
            json!({"metadata": {"creationTimestamp": t}}),
        )
    };
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T11:00:00Z"}});
    let pending_on = |name: &str, node: &str| {
        Arc::new(serde_json::from_value::<CachedPod>(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "agent"}},
            "spec": {"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}
        })).unwrap())
    };
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        nodes: Vec<Arc<Node>>,
        pods: Vec<Arc<CachedPod>>,
        want_create: Vec<&'static str>,
        want_delete: Vec<&'static str>,
        want_events: Vec<&'static str>,
    }
    let cases = vec![
        Case {
            name: "DS-1 every eligible node without a Pod gets one",
            ds: ds(),
            nodes: vec![node("n1"), node("n2"), node("n3")],
            pods: vec![ready("a", "n2", HASH)],
            want_create: vec!["n1", "n3"],
            want_delete: vec![],
            want_events: vec![],
        },
        Case {
            name: "DS-4 a node the selector no longer matches loses its Pod",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeSelector": {"disk": "ssd"}}}}})),
            nodes: vec![node("n1")],
            pods: vec![ready("a", "n1", HASH)],
            want_create: vec![],
            want_delete: vec!["a"],
            want_events: vec![],
        },
        Case {
            name: "DS-4 NoSchedule taint keeps the running Pod",
            ds: ds(),
            nodes: vec![
                tainted("n1", "dedicated", "NoSchedule"),
                tainted("n2", "dedicated", "NoSchedule"),
            ],
            pods: vec![ready("a", "n1", HASH)],
            want_create: vec![],
            want_delete: vec![],
            want_events: vec![],
        },
        Case {
            name: "DS-4 NoExecute taint removes the Pod (not one already being deleted)",
            ds: ds(),
            nodes: vec![tainted("n1", "dedicated", "NoExecute")],
            pods: vec![
                ready("a", "n1", HASH),
                pod_full("b", "n1", HASH, None, deleting.clone()),
            ],
            want_create: vec![],
            want_delete: vec!["a"],
            want_events: vec![],
        },
        Case {
            name: "DS-5 a failed Pod is deleted with a FailedDaemonPod warning",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![failed("f", "n1")],
            want_create: vec![],
            want_delete: vec!["f"],
            want_events: vec![FAILED_DAEMON_POD],
        },
        Case {
            name: "DS-5 a succeeded Pod is deleted with a SucceededDaemonPod event",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![succeeded("s", "n1")],
            want_create: vec![],
            want_delete: vec!["s"],
            want_events: vec![SUCCEEDED_DAEMON_POD],
        },
        Case {
            name: "DS-5 duplicates without surge: the oldest stays",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![
                older("young", "n1", "2026-01-01T10:00:00Z"),
                older("old", "n1", "2026-01-01T09:00:00Z"),
                older("mid", "n1", "2026-01-01T09:30:00Z"),
            ],
            want_create: vec![],
            want_delete: vec!["mid", "young"],
            want_events: vec![],
        },
        Case {
            name: "DS-5 duplicates: a bound Pod wins over an older pending one",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![
                older("bound", "n1", "2026-01-01T10:00:00Z"),
                pending_on("pending", "n1"),
            ],
            want_create: vec![],
            want_delete: vec!["pending"],
            want_events: vec![],
        },
        Case {
            name: "DS-7 surge: old ready and new not yet available share the node",
            ds: surge_ds(json!(1)),
            nodes: vec![node("n1")],
            pods: vec![ready("old", "n1", "h1"), unready("new", "n1", HASH)],
            want_create: vec![],
            want_delete: vec![],
            want_events: vec![],
        },
        Case {
            name: "DS-7 surge: the new Pod available, the old one goes",
            ds: surge_ds(json!(1)),
            nodes: vec![node("n1")],
            pods: vec![ready("old", "n1", "h1"), ready("new", "n1", HASH)],
            want_create: vec![],
            want_delete: vec!["old"],
            want_events: vec![],
        },
        Case {
            name: "DS-7 surge: an old Pod no longer ready goes at once",
            ds: surge_ds(json!(1)),
            nodes: vec![node("n1")],
            pods: vec![unready("old", "n1", "h1"), unready("new", "n1", HASH)],
            want_create: vec![],
            want_delete: vec!["old"],
            want_events: vec![],
        },
        Case {
            name: "DS-7 surge: only terminating Pods left, a new one is created",
            ds: surge_ds(json!(1)),
            nodes: vec![node("n1")],
            pods: vec![pod_full("gone", "n1", HASH, None, deleting.clone())],
            want_create: vec!["n1"],
            want_delete: vec![],
            want_events: vec![],
        },
        Case {
            name: "DS-5 an unbound Pod for a vanished node is deleted",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![
                ready("a", "n1", HASH),
                pending_on("orphaned", "gone-node"),
                ready("bound", "gone-node", HASH),
            ],
            want_create: vec![],
            want_delete: vec!["orphaned"],
            want_events: vec![],
        },
    ];
    for c in cases {
        let mut b = backoff();
        let elig = Eligibility::of(&c.ds);
        let got = manage(
            &c.ds,
            &elig,
            &c.nodes,
            &by_node(&c.pods),
            HASH,
            &mut b,
            clock(),
        );
        let mut del = got.delete.clone();
        del.sort();
        assert_eq!(got.create_on, c.want_create, "{}", c.name);
        assert_eq!(del, c.want_delete, "{}", c.name);
        let reasons: Vec<&str> = got.events.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, c.want_events, "{}", c.name);
    }
}

#[test]
fn ds5_failed_pods_are_deleted_with_backoff() {
    let d = ds();
    let elig = Eligibility::of(&d);
    let nodes = vec![node("n1")];
    let failed = pod_full(
        "f",
        "n1",
        HASH,
        None,
        json!({"status": {"phase": "Failed"}}),
    );
    let pods = by_node(std::slice::from_ref(&failed));
    let mut b = backoff();
    let t0 = clock();
    let first = manage(&d, &elig, &nodes, &pods, HASH, &mut b, t0);
    assert_eq!(first.delete, ["f"], "DS-5 first failure: deleted at once");
    let again = manage(&d, &elig, &nodes, &pods, HASH, &mut b, t0);
    assert!(
        again.delete.is_empty(),
        "DS-5 within the backoff: not deleted again"
    );
    assert_eq!(
        again.requeue_after,
        Some(Duration::from_secs(1)),
        "DS-5 requeued after the delay"
    );
    let later = Clock {
        instant: t0.instant + Duration::from_millis(1100),
        ..t0
    };
    let third = manage(&d, &elig, &nodes, &pods, HASH, &mut b, later);
    assert_eq!(third.delete, ["f"], "DS-5 after the delay: deleted again");
    assert_eq!(
        b.delay(&failed_pods_backoff_key(&d, "n1")),
        Duration::from_secs(2),
        "DS-5 delay doubles"
    );
}

#[test]
fn ds7_rolling_update_max_unavailable() {
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        nodes: Vec<Arc<Node>>,
        pods: Vec<Arc<CachedPod>>,
        want_delete: Vec<&'static str>,
    }
    let three = || vec![node("n1"), node("n2"), node("n3")];
    let cases = vec![
        Case {
            name: "DS-7 maxUnavailable 1: one old available Pod deleted",
            ds: ds(),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec!["a"],
        },
        Case {
            name: "DS-7 maxUnavailable 2 deletes two",
            ds: ds_with(
                json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}}}}),
            ),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec!["a", "b"],
        },
        Case {
            name: "DS-7 a new Pod not yet available uses the budget: nothing deleted",
            ds: ds(),
            nodes: three(),
            pods: vec![
                unready("a", "n1", HASH),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 a node without a Pod uses the budget",
            ds: ds(),
            nodes: three(),
            pods: vec![ready("b", "n2", "h1"), ready("c", "n3", "h1")],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 old unavailable Pods are replaced regardless of the budget",
            ds: ds(),
            nodes: three(),
            pods: vec![
                unready("a", "n1", "h1"),
                unready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec!["a", "b"],
        },
        Case {
            name: "DS-7 minReadySeconds: a ready new Pod not yet available blocks the next",
            ds: ds_with(json!({"spec": {"minReadySeconds": 30}})),
            nodes: three(),
            pods: vec![
                pod_full("a", "n1", HASH, Some("2026-01-01T11:59:50Z"), json!({})),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 25% of 3 rounds up to 1",
            ds: ds_with(
                json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%"}}}}),
            ),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec!["a"],
        },
        Case {
            name: "DS-7 maxUnavailable 0 and maxSurge 0 behaves as maxUnavailable 1",
            ds: ds_with(
                json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}}}),
            ),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_delete: vec!["a"],
        },
        Case {
            name: "DS-7 all current: nothing to do",
            ds: ds(),
            nodes: three(),
            pods: vec![
                ready("a", "n1", HASH),
                ready("b", "n2", HASH),
                ready("c", "n3", HASH),
            ],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 the template-generation label counts as current",
            ds: ds(),
            nodes: vec![node("n1")],
            pods: vec![pod_full(
                "a",
                "n1",
                "old-hash",
                Some("2026-01-01T00:00:00Z"),
                json!({"metadata": {"labels": {TEMPLATE_GENERATION_LABEL: "2"}}}),
            )],
            want_delete: vec![],
        },
    ];
    for c in cases {
        let elig = Eligibility::of(&c.ds);
        let got =
            rolling_update(&c.ds, &elig, &c.nodes, by_node(&c.pods), HASH, clock().now).unwrap();
        assert!(
            got.create_on.is_empty(),
            "{}: no creations without surge",
            c.name
        );
        assert_eq!(got.delete, c.want_delete, "{}", c.name);
    }
}

#[test]
fn ds7_rolling_update_max_surge() {
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        nodes: Vec<Arc<Node>>,
        pods: Vec<Arc<CachedPod>>,
        want_create: Vec<&'static str>,
        want_delete: Vec<&'static str>,
    }
    let three = || vec![node("n1"), node("n2"), node("n3")];
    let cases = vec![
        Case {
            name: "DS-7 maxSurge 1: one new Pod beside an available old one",
            ds: surge_ds(json!(1)),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_create: vec!["n1"],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 maxSurge 100% surges on every node",
            ds: surge_ds(json!("100%")),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_create: vec!["n1", "n2", "n3"],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 a surging new Pod not yet available holds the budget",
            ds: surge_ds(json!(1)),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                unready("a2", "n1", HASH),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_create: vec![],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 the new Pod available: the old one on its node goes, the next node surges",
            ds: surge_ds(json!(1)),
            nodes: three(),
            pods: vec![
                ready("a", "n1", "h1"),
                ready("a2", "n1", HASH),
                ready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_create: vec!["n2"],
            want_delete: vec!["a"],
        },
        Case {
            name: "DS-7 an unavailable old Pod gets its replacement beyond the budget",
            ds: surge_ds(json!(1)),
            nodes: three(),
            pods: vec![
                unready("a", "n1", "h1"),
                unready("b", "n2", "h1"),
                ready("c", "n3", "h1"),
            ],
            want_create: vec!["n1", "n2", "n3"],
            want_delete: vec![],
        },
        Case {
            name: "DS-7 an unavailable old Pod on a node that no longer qualifies is deleted",
            ds: ds_with(
                json!({"spec": {"template": {"spec": {"nodeSelector": {"keep": "yes"}}},
                "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}}),
            ),
            nodes: vec![
                node_with("n1", json!({"metadata": {"labels": {"keep": "yes"}}})),
                node("n2"),
            ],
            pods: vec![ready("a", "n1", HASH), unready("b", "n2", "h1")],
            want_create: vec![],
            want_delete: vec!["b"],
        },
        Case {
            name:
                "DS-7 an available Pod off the constraints waits while nothing extra is available",
            ds: ds_with(
                json!({"spec": {"template": {"spec": {"nodeSelector": {"keep": "yes"}}},
                "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}}),
            ),
            nodes: vec![
                node_with("n1", json!({"metadata": {"labels": {"keep": "yes"}}})),
                node("n2"),
            ],
            pods: vec![unready("a", "n1", HASH), ready("b", "n2", "h1")],
            want_create: vec![],
            want_delete: vec![],
        },
    ];
    for c in cases {
        let elig = Eligibility::of(&c.ds);
        let got =
            rolling_update(&c.ds, &elig, &c.nodes, by_node(&c.pods), HASH, clock().now).unwrap();
        assert_eq!(got.create_on, c.want_create, "{}", c.name);
        assert_eq!(got.delete, c.want_delete, "{}", c.name);
    }
}

#[test]
fn ds7_invalid_rolling_parameters_name_the_field() {
    let d =
        ds_with(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "x"}}}}));
    let err = rolling_update(
        &d,
        &Eligibility::of(&d),
        &[node("n1")],
        NodePods::new(),
        HASH,
        clock().now,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("DaemonSet ns/agent") && err.contains("MaxUnavailable"),
        "{err}"
    );
}

#[test]
fn ds9_status_counts() {
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        nodes: Vec<Arc<Node>>,
        pods: Vec<Arc<CachedPod>>,
        // desired, current, misscheduled, ready, updated, available, unavailable
        want: (i32, i32, i32, i32, i32, i32, i32),
    }
    let cases = vec![
        Case {
            name: "DS-9 all scheduled, ready, updated",
            ds: ds(),
            nodes: vec![node("n1"), node("n2")],
            pods: vec![ready("a", "n1", HASH), ready("b", "n2", HASH)],
            want: (2, 2, 0, 2, 2, 2, 0),
        },
        Case {
            name: "DS-9 one missing, one old and not ready",
            ds: ds(),
            nodes: vec![node("n1"), node("n2"), node("n3")],
            pods: vec![ready("a", "n1", HASH), unready("b", "n2", "h1")],
            want: (3, 2, 0, 1, 1, 1, 2),
        },
        Case {
            name: "DS-9 a Pod on a node that should not run it is misscheduled",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeSelector": {"keep": "yes"}}}}})),
            nodes: vec![
                node_with("n1", json!({"metadata": {"labels": {"keep": "yes"}}})),
                node("n2"),
            ],
            pods: vec![ready("a", "n1", HASH), ready("b", "n2", HASH)],
            want: (1, 1, 1, 1, 1, 1, 0),
        },
        Case {
            name: "DS-9 minReadySeconds: ready but not yet available",
            ds: ds_with(json!({"spec": {"minReadySeconds": 60}})),
            nodes: vec![node("n1")],
            pods: vec![pod_full(
                "a",
                "n1",
                HASH,
                Some("2026-01-01T11:59:30Z"),
                json!({}),
            )],
            want: (1, 1, 0, 1, 1, 0, 1),
        },
        Case {
            name: "DS-9 a NoSchedule-tainted node with its Pod: not desired, misscheduled",
            ds: ds(),
            nodes: vec![tainted("n1", "dedicated", "NoSchedule")],
            pods: vec![ready("a", "n1", HASH)],
            want: (0, 0, 1, 0, 0, 0, 0),
        },
    ];
    for c in cases {
        let elig = Eligibility::of(&c.ds);
        let s = calculate_status(&c.ds, &elig, &c.nodes, &by_node(&c.pods), HASH, clock().now);
        let got = (
            s.desired_number_scheduled,
            s.current_number_scheduled,
            s.number_misscheduled,
            s.number_ready,
            s.updated_number_scheduled.unwrap(),
            s.number_available.unwrap(),
            s.number_unavailable.unwrap(),
        );
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn ds9_status_write_short_cut() {
    let d = ds_with(
        json!({"status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1,
        "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1}}),
    );
    let elig = Eligibility::of(&d);
    let same = calculate_status(
        &d,
        &elig,
        &[node("n1")],
        &by_node(&[ready("a", "n1", HASH)]),
        HASH,
        clock().now,
    );
    assert!(
        !needs_status_update(&d, &same, true),
        "DS-9 unchanged counts: no write"
    );
    let behind = ds_with(
        json!({"metadata": {"generation": 3}, "status": {"desiredNumberScheduled": 1,
        "currentNumberScheduled": 1, "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1}}),
    );
    assert!(
        needs_status_update(&behind, &same, true),
        "DS-9 observedGeneration behind: write"
    );
    assert!(
        !needs_status_update(&behind, &same, false),
        "DS-9 observedGeneration behind on a sync that does not raise it: no write"
    );
}

fn revision(name: &str, rev: i64, data: Value) -> Arc<ControllerRevision> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {REVISION_HASH_LABEL: name}},
            "data": data, "revision": rev
        }))
        .unwrap(),
    )
}

#[test]
fn ds3_history_current_old_dedup_and_cleanup() {
    let d = ds();
    let current = revision_data(&d);
    assert_eq!(
        current["spec"]["template"]["$patch"], "replace",
        "DS-3 the revision replaces the whole template"
    );
    // The same template as Go encodes it (an empty resources object, no creationTimestamp).
    let go_encoded = json!({"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "agent"}},
        "spec": {"containers": [{"name": "c", "image": "agent:2", "resources": {}}]}}}});
    let other = json!({"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "agent"}},
        "spec": {"containers": [{"name": "c", "image": "agent:1"}]}}}});
    let histories = vec![
        revision("r1", 1, other.clone()),
        revision("r3", 3, current.clone()),
        revision("r4", 4, go_encoded),
        revision("r2", 2, other.clone()),
    ];
    let (cur, old) = split_histories(&d, &histories);
    let names = |v: &[Arc<ControllerRevision>]| v.iter().map(|c| c.name_any()).collect::<Vec<_>>();
    assert_eq!(
        names(&cur),
        ["r3", "r4"],
        "DS-3 revisions equal up to empty fields are current"
    );
    assert_eq!(names(&old), ["r1", "r2"]);
    assert_eq!(
        dedup_keep(&cur).unwrap().name_any(),
        "r4",
        "DS-3 dedup keeps the highest revision"
    );
    assert_eq!(
        max_revision(&old) + 1,
        3,
        "DS-3 the current revision number follows the old ones"
    );

    struct Case {
        name: &'static str,
        limit: i32,
        live: Vec<Arc<CachedPod>>,
        want: Vec<&'static str>,
    }
    let old: Vec<_> = (1..=4)
        .map(|i| revision(&format!("r{i}"), i, other.clone()))
        .collect();
    let cases = vec![
        Case {
            name: "DS-3 within the limit: nothing deleted",
            limit: 10,
            live: vec![],
            want: vec![],
        },
        Case {
            name: "DS-3 over the limit: oldest revisions first",
            limit: 2,
            live: vec![],
            want: vec!["r1", "r2"],
        },
        Case {
            name: "DS-3 a revision a live Pod carries is kept",
            limit: 2,
            live: vec![ready("a", "n1", "r1")],
            want: vec!["r2", "r3"],
        },
        Case {
            name: "DS-3 limit 0 deletes every unused old revision",
            limit: 0,
            live: vec![],
            want: vec!["r1", "r2", "r3", "r4"],
        },
    ];
    for c in cases {
        let d = ds_with(json!({"spec": {"revisionHistoryLimit": c.limit}}));
        assert_eq!(histories_to_delete(&d, &old, &c.live), c.want, "{}", c.name);
    }
}

#[test]
fn ds3_new_revision_is_named_by_hash_and_collision_count() {
    let d = ds();
    let h0 = revision_hash(&d);
    let bumped = ds_with(json!({"status": {"collisionCount": 1}}));
    let h1 = revision_hash(&bumped);
    assert_ne!(h0, h1, "DS-3 a collisionCount bump gives another name");
    let changed = ds_with(
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:3"}]}}}}),
    );
    assert_ne!(
        h0,
        revision_hash(&changed),
        "DS-3 another template, another hash"
    );
    let cr = new_revision(&d, &h0, 5);
    assert_eq!(cr.name_any(), format!("agent-{h0}"));
    assert_eq!(cr.revision, 5);
    assert_eq!(cr.labels().get(REVISION_HASH_LABEL), Some(&h0));
    assert_eq!(
        cr.labels().get("app").map(String::as_str),
        Some("agent"),
        "template labels copied"
    );
    assert!(revision_matches(&d, &cr));
    assert!(!revision_matches(&changed, &cr));
}

#[test]
fn ds7_surge_and_unavailable_counts() {
    type Case = (&'static str, DaemonSet, i32, Result<(i32, i32), ()>);
    let cases: Vec<Case> = vec![
        ("DS-7 ints as given", surge_ds(json!(2)), 10, Ok((2, 0))),
        (
            "DS-7 percentages round up",
            ds_with(
                json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%", "maxSurge": "15%"}}}}),
            ),
            10,
            Ok((2, 1)),
        ),
        (
            "DS-7 OnDelete: no budget",
            ds_with(
                json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}),
            ),
            10,
            Ok((0, 0)),
        ),
        (
            "DS-7 a bad percentage is an error",
            ds_with(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxSurge": "x%"}}}})),
            10,
            Err(()),
        ),
    ];
    for (name, d, n, want) in cases {
        let got = match (surge_count(&d, n), unavailable_count(&d, n)) {
            (Ok(s), Ok(u)) => Ok((s, u)),
            _ => Err(()),
        };
        assert_eq!(got, want, "{name}");
    }
    assert!(allows_surge(&surge_ds(json!(1))));
    assert!(!allows_surge(&ds()));
}

#[test]
fn ds2_node_updates_queue_only_daemon_sets_whose_eligibility_changed() {
    let misscheduled = ds_with(json!({"status": {"numberMisscheduled": 1}}));
    struct Case {
        name: &'static str,
        ds: DaemonSet,
        node: Arc<Node>,
        scheduled: bool,
        want: bool,
    }
    let cases = [
        Case {
            name: "DS-2 an eligible node without a Pod",
            ds: ds(),
            node: node("n1"),
            scheduled: false,
            want: true,
        },
        Case {
            name: "DS-2 an eligible node with its Pod",
            ds: ds(),
            node: node("n1"),
            scheduled: true,
            want: false,
        },
        Case {
            name: "DS-2 NoExecute on a node with a Pod",
            ds: ds(),
            node: tainted("n1", "x", "NoExecute"),
            scheduled: true,
            want: true,
        },
        Case {
            name: "DS-2 NoSchedule on a node with a Pod: nothing to create or delete (v1.34)",
            ds: ds(),
            node: tainted("n1", "x", "NoSchedule"),
            scheduled: true,
            want: false,
        },
        Case {
            name: "DS-2 a Pod there while misscheduled Pods are counted",
            ds: misscheduled,
            node: node("n1"),
            scheduled: true,
            want: true,
        },
        Case {
            name: "DS-2 an ineligible node without a Pod",
            ds: ds_with(json!({"spec": {"template": {"spec": {"nodeSelector": {"x": "y"}}}}})),
            node: node("n1"),
            scheduled: false,
            want: false,
        },
    ];
    for c in cases {
        let got = node_update_needs_sync(&c.ds, &Eligibility::of(&c.ds), &c.node, c.scheduled);
        assert_eq!(got, c.want, "{}", c.name);
    }
    let changes: Vec<(&str, Arc<Node>, Arc<Node>, bool)> = vec![
        (
            "DS-2 a status-only change is ignored",
            node("n1"),
            node_with("n1", json!({"status": {"phase": "Running"}})),
            false,
        ),
        (
            "DS-2 a label change matters",
            node("n1"),
            node_with("n1", json!({"metadata": {"labels": {"a": "b"}}})),
            true,
        ),
        (
            "DS-2 a taint change matters",
            node("n1"),
            tainted("n1", "x", "NoSchedule"),
            true,
        ),
        (
            "DS-2 no taints and an empty taint list are the same",
            node("n1"),
            node_with("n1", json!({"spec": {"taints": []}})),
            false,
        ),
    ];
    for (name, old, new, want) in changes {
        assert_eq!(node_change_matters(&old, &new), want, "{name}");
    }
}
