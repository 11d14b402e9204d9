//! The scheduling cases as data: nodes, Pods and where each Pod may end up, in stages (a stage's
//! nodes and Pods are created, then its expectations awaited, before the next stage). Every case
//! runs in its own namespace on its own nodes: each node carries the label `kpr-case=<case>` and
//! every Pod a nodeSelector for it, so cases run concurrently on one cluster and against either
//! scheduler (a differential run can reuse them as they are).

use serde_json::{json, Value};

/// The label tying a case's Pods to its nodes.
pub const CASE_LABEL: &str = "kpr-case";
/// The PriorityClass of preemptors (created once per cluster).
pub const HIGH_PRIORITY: &str = "kpr-e2e-high";

/// Where a Pod must end up.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// Bound to one of these nodes.
    On(Vec<&'static str>),
    /// PodScheduled=False/Unschedulable with a FailedScheduling Event whose message contains
    /// this text.
    Unschedulable(&'static str),
    /// Deleted (a preemption victim).
    Deleted,
}

/// Constraints over several Pods.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// These Pods are on pairwise different nodes.
    Distinct(Vec<&'static str>),
}

pub struct Stage {
    pub nodes: Vec<Value>,
    pub pods: Vec<Value>,
    pub expect: Vec<(&'static str, Expect)>,
    pub checks: Vec<Check>,
}

pub struct Case {
    pub name: &'static str,
    pub stages: Vec<Stage>,
}

/// A node of `case` with `cpu` cores, extra labels and taints.
pub fn node(case: &str, name: &str, cpu: &str, labels: Value, taints: Value) -> Value {
    let mut l = json!({CASE_LABEL: case, "kubernetes.io/hostname": name, "type": "kwok"});
    l.as_object_mut()
        .unwrap()
        .extend(labels.as_object().cloned().unwrap_or_default());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": taints},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
        }
    })
}

/// A Pod requesting `cpu`, with extra spec fields (affinity, tolerations, ...) and labels.
pub fn pod(name: &str, cpu: &str, labels: Value, extra: Value) -> Value {
    let mut spec = json!({
        "containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}}}],
        "terminationGracePeriodSeconds": 0,
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec})
}

fn none() -> Value {
    json!({})
}

fn stage(nodes: Vec<Value>, pods: Vec<Value>, expect: Vec<(&'static str, Expect)>) -> Stage {
    Stage {
        nodes,
        pods,
        expect,
        checks: Vec::new(),
    }
}

pub fn all() -> Vec<Case> {
    let zone = |z: &str| json!({"kpr.test/zone": z});
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "anti"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}});
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kpr.test/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "spread"}}}]});
    vec![
        Case {
            name: "resources",
            stages: vec![
                stage(
                    vec![
                        node("resources", "res-small", "2", none(), json!([])),
                        node("resources", "res-big", "4", none(), json!([])),
                    ],
                    vec![
                        pod("big", "3", none(), none()),
                        pod("small", "1", none(), none()),
                        pod("huge", "6", none(), none()),
                    ],
                    vec![
                        ("big", Expect::On(vec!["res-big"])),
                        ("small", Expect::On(vec!["res-small", "res-big"])),
                        ("huge", Expect::Unschedulable("Insufficient cpu")),
                    ],
                ),
                // The unschedulable Pod is scheduled once a node that fits appears.
                stage(
                    vec![node("resources", "res-huge", "8", none(), json!([]))],
                    vec![],
                    vec![("huge", Expect::On(vec!["res-huge"]))],
                ),
            ],
        },
        Case {
            name: "taints",
            stages: vec![stage(
                vec![
                    node(
                        "taints",
                        "tnt-gpu",
                        "8",
                        none(),
                        json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
                    ),
                    node("taints", "tnt-plain", "8", none(), json!([])),
                ],
                vec![
                    pod("plain-1", "1", none(), none()),
                    pod("plain-2", "1", none(), none()),
                    pod(
                        "tolerant",
                        "1",
                        none(),
                        json!({"tolerations": [{"key": "dedicated", "operator": "Equal",
                            "value": "gpu", "effect": "NoSchedule"}]}),
                    ),
                ],
                vec![
                    ("plain-1", Expect::On(vec!["tnt-plain"])),
                    ("plain-2", Expect::On(vec!["tnt-plain"])),
                    ("tolerant", Expect::On(vec!["tnt-gpu", "tnt-plain"])),
                ],
            )],
        },
        Case {
            name: "affinity",
            stages: vec![stage(
                vec![
                    node("affinity", "aff-z1", "4", zone("z1"), json!([])),
                    node("affinity", "aff-z2", "4", zone("z2"), json!([])),
                    node("affinity", "aff-z3", "4", zone("z3"), json!([])),
                ],
                vec![
                    pod(
                        "required",
                        "1",
                        none(),
                        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                            {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "kpr.test/zone", "operator": "In", "values": ["z1"]}]}]}}}}),
                    ),
                    pod(
                        "preferred",
                        "1",
                        none(),
                        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 100, "preference": {"matchExpressions": [
                                {"key": "kpr.test/zone", "operator": "In", "values": ["z3"]}]}}]}}}),
                    ),
                    pod(
                        "nowhere",
                        "1",
                        none(),
                        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                            {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "kpr.test/zone", "operator": "In", "values": ["z9"]}]}]}}}}),
                    ),
                ],
                vec![
                    ("required", Expect::On(vec!["aff-z1"])),
                    ("preferred", Expect::On(vec!["aff-z3"])),
                    (
                        "nowhere",
                        Expect::Unschedulable("didn't match Pod's node affinity/selector"),
                    ),
                ],
            )],
        },
        Case {
            name: "spread",
            stages: vec![Stage {
                nodes: vec![
                    node("spread", "spr-a", "8", zone("a"), json!([])),
                    node("spread", "spr-b", "8", zone("b"), json!([])),
                    node("spread", "spr-c", "8", zone("c"), json!([])),
                ],
                pods: (1..=3)
                    .map(|i| {
                        pod(
                            &format!("s{i}"),
                            "100m",
                            json!({"app": "spread"}),
                            spread.clone(),
                        )
                    })
                    .collect(),
                expect: (["s1", "s2", "s3"])
                    .into_iter()
                    .map(|p| (p, Expect::On(vec!["spr-a", "spr-b", "spr-c"])))
                    .collect(),
                checks: vec![Check::Distinct(vec!["s1", "s2", "s3"])],
            }],
        },
        Case {
            name: "anti-affinity",
            stages: vec![
                Stage {
                    nodes: vec![
                        node("anti-affinity", "anti-1", "8", none(), json!([])),
                        node("anti-affinity", "anti-2", "8", none(), json!([])),
                    ],
                    pods: vec![
                        pod("a1", "100m", json!({"app": "anti"}), anti.clone()),
                        pod("a2", "100m", json!({"app": "anti"}), anti.clone()),
                    ],
                    expect: vec![
                        ("a1", Expect::On(vec!["anti-1", "anti-2"])),
                        ("a2", Expect::On(vec!["anti-1", "anti-2"])),
                    ],
                    checks: vec![Check::Distinct(vec!["a1", "a2"])],
                },
                stage(
                    vec![],
                    vec![pod("a3", "100m", json!({"app": "anti"}), anti.clone())],
                    vec![(
                        "a3",
                        Expect::Unschedulable("didn't match pod anti-affinity rules"),
                    )],
                ),
            ],
        },
        Case {
            name: "preemption",
            stages: vec![
                stage(
                    vec![node("preemption", "pre-1", "2", none(), json!([]))],
                    vec![pod("low", "1500m", none(), none())],
                    vec![("low", Expect::On(vec!["pre-1"]))],
                ),
                stage(
                    vec![],
                    vec![pod(
                        "high",
                        "1500m",
                        none(),
                        json!({"priorityClassName": HIGH_PRIORITY}),
                    )],
                    vec![
                        ("low", Expect::Deleted),
                        ("high", Expect::On(vec!["pre-1"])),
                    ],
                ),
            ],
        },
    ]
}
