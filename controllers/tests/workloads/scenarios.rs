//! The scenarios, each a function of a [`Run`] returning an [`Outcome`]: what the differential
//! test compares (normalised: ReplicaSets by role `rs<n>`, Pods by the part the scenario gave
//! them) and the expectations that hold for kube-controller-manager v1.34 on their own (the
//! sequences below were worked out from upstream's `rolling.go`, `sync.go` and
//! `controller_utils.go`, and kube-controller-manager's runs reproduce them).
//!
//! Owns: the objects it creates in its run's namespace; the restart scenario also owns its
//! control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::ResourceExt as _;
use serde::Serialize;
use serde_json::{json, Value};

use super::harness::{active_names, gate, rollout_complete, Run, NODES};
use super::world::{
    controller_rs, deployment_of, is_active, is_ready, owner_kinds, spec_replicas, Bounds, State,
};

/// What one scenario run shows.
#[derive(Debug, Default)]
pub struct Outcome {
    /// What the differential test compares, by name.
    pub record: BTreeMap<String, Value>,
    /// Expectations this run broke.
    pub problems: Vec<String>,
}

impl Outcome {
    fn record(&mut self, key: &str, value: impl Serialize) {
        let value = serde_json::to_value(value).expect("records are plain data");
        self.record.insert(key.to_string(), value);
    }

    fn expect_eq<T: PartialEq + Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.problems
                .push(format!("{what}:\n  got  {got:?}\n  want {want:?}"));
        }
    }

    fn no_violations(&mut self, s: &State) {
        if !s.violations.is_empty() {
            self.problems.push(format!(
                "{} observed states broke the surge/availability bounds; the first:\n{}",
                s.violations.len(),
                s.violations[0]
            ));
        }
    }
}

/// The image every scenario starts from and the one it rolls out.
fn image(d: &str, version: u32) -> String {
    format!("example.invalid/{d}:{version}")
}

/// maxSurge 3 / maxUnavailable 2, the issue's rolling update.
fn strategy(manifest: &mut Value) {
    manifest["spec"]["strategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}});
}

/// A Deployment's ReplicaSet sizes since step `mark`, as `rs1=8 rs2=5`.
fn sizes_since(s: &State, d: &str, mark: usize) -> Vec<String> {
    s.sizes
        .get(d)
        .map(|seq| seq[mark.min(seq.len())..].iter().map(|v| line(v)).collect())
        .unwrap_or_default()
}

fn line(sizes: &[(String, i32)]) -> String {
    sizes
        .iter()
        .map(|(role, n)| format!("{role}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn sizes_len(s: &State, d: &str) -> usize {
    s.sizes.get(d).map_or(0, Vec::len)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The `deployment.kubernetes.io/` annotations of an object, prefix dropped.
fn deployment_annotations(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter_map(|(k, v)| {
            k.strip_prefix("deployment.kubernetes.io/")
                .map(|k| (k.to_string(), v.clone()))
        })
        .collect()
}

/// Per ReplicaSet role: spec.replicas and its `deployment.kubernetes.io/` annotations.
fn replicasets_summary(s: &State, d: &str) -> BTreeMap<String, Value> {
    s.replicasets_of(d)
        .into_iter()
        .map(|rs: &ReplicaSet| {
            (
                s.role(&rs.name_any()),
                json!({
                    "replicas": spec_replicas(rs),
                    "annotations": deployment_annotations(&rs.metadata),
                }),
            )
        })
        .collect()
}

/// Whether every ReplicaSet of `d` is named `<d>-<pod-template-hash>` and carries that label in
/// its selector and Pod template. The hash's value is not compared: upstream hashes Go's `spew`
/// printout of the template (docs/WORKLOADS.md).
fn hash_names_hold(s: &State, d: &str) -> bool {
    const HASH: &str = "pod-template-hash";
    s.replicasets_of(d).into_iter().all(|rs| {
        let Some(spec) = rs.spec.as_ref() else {
            return false;
        };
        let selected = spec
            .selector
            .match_labels
            .as_ref()
            .and_then(|l| l.get(HASH));
        let templated = spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref()?.labels.as_ref()?.get(HASH));
        let labelled = rs.labels().get(HASH);
        labelled.is_some_and(|h| {
            !h.is_empty()
                && rs.name_any() == format!("{d}-{h}")
                && selected == Some(h)
                && templated == Some(h)
        })
    })
}

/// The Deployment's conditions (type, status, reason, message with ReplicaSet names replaced
/// by their roles) and its revision.
fn deployment_summary(s: &State, d: &str) -> Value {
    let Some(dep) = s.deployments.get(d) else {
        return Value::Null;
    };
    let conditions: Vec<Value> = conditions(dep)
        .into_iter()
        .map(|(t, st, reason, msg)| {
            let mut msg = msg;
            for (name, role) in &s.roles {
                msg = msg.replace(name, role);
            }
            json!([t, st, reason, msg])
        })
        .collect();
    json!({
        "annotations": deployment_annotations(&dep.metadata),
        "conditions": conditions,
    })
}

fn conditions(dep: &Deployment) -> Vec<(String, String, String, String)> {
    let mut out: Vec<_> = dep
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Scenarios 1 and 2: `kubectl create deployment web --replicas 10` (gated, minReadySeconds 2),
/// maxSurge 3 / maxUnavailable 2 and a new image, rolled out in waves with the bounds checked at
/// every observed state and `kubectl rollout status` succeeding; then `kubectl rollout undo`.
pub async fn rollout_and_undo(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "web";
    run.create_deployment(
        &[d, &format!("--image={}", image(d, 1)), "--replicas=10"],
        |m| gate(m, 2),
    )
    .await?;
    run.roll_out_in_waves(d).await?;
    run.change_deployment(
        d,
        &[
            "patch",
            "deployment",
            d,
            "-p",
            r#"{"spec":{"strategy":{"rollingUpdate":{"maxSurge":3,"maxUnavailable":2}}}}"#,
        ],
    )
    .await?;
    run.settled(d).await?;
    let mark = {
        let mut s = run.lock();
        s.bounds.insert(
            d.into(),
            Bounds {
                max_total: 13,
                min_available: 8,
                min_ready_seconds: 2,
            },
        );
        sizes_len(&s, d)
    };
    run.change_deployment(
        d,
        &[
            "set",
            "image",
            &format!("deployment/{d}"),
            &format!("web={}", image(d, 2)),
        ],
    )
    .await?;
    let status = run.rollout_status(d);
    let waves = run.roll_out_in_waves(d).await?;
    status.await??;
    {
        let s = run.lock();
        let sizes = sizes_since(&s, d, mark);
        out.expect_eq(
            "rollout: ReplicaSet sizes at each step",
            sizes.clone(),
            strings(&[
                "rs1=10 rs2=3",
                "rs1=8 rs2=3",
                "rs1=8 rs2=5",
                "rs1=3 rs2=5",
                "rs1=3 rs2=10",
                "rs1=0 rs2=10",
            ]),
        );
        out.record("1 rollout: ReplicaSet sizes", sizes);
        out.record("1 rollout: waves of Pods becoming Ready", waves);
        out.record("1 rollout: ReplicaSets", replicasets_summary(&s, d));
        out.expect_eq(
            "rollout: ReplicaSets named by pod-template-hash",
            hash_names_hold(&s, d),
            true,
        );
        out.record(
            "1 rollout: ReplicaSets named by pod-template-hash",
            hash_names_hold(&s, d),
        );
        out.record("1 rollout: Deployment", deployment_summary(&s, d));
    }

    let mark = sizes_len(&run.lock(), d);
    run.change_deployment(d, &["rollout", "undo", &format!("deployment/{d}")])
        .await?;
    let status = run.rollout_status(d);
    let waves = run.roll_out_in_waves(d).await?;
    status.await??;
    let s = run.lock();
    let sizes = sizes_since(&s, d, mark);
    out.expect_eq(
        "undo: ReplicaSet sizes at each step",
        sizes.clone(),
        strings(&[
            "rs1=3 rs2=10",
            "rs1=3 rs2=8",
            "rs1=5 rs2=8",
            "rs1=5 rs2=3",
            "rs1=10 rs2=3",
            "rs1=10 rs2=0",
        ]),
    );
    let rss = replicasets_summary(&s, d);
    out.expect_eq(
        "undo: the ReplicaSets (the first one restored, no third)",
        rss.keys().cloned().collect::<Vec<_>>(),
        strings(&["rs1", "rs2"]),
    );
    // Upstream gives the restored ReplicaSet the next revision and remembers its old one.
    let annotation = |role: &str, key: &str| {
        rss.get(role)
            .and_then(|v| v["annotations"][key].as_str().map(str::to_string))
    };
    out.expect_eq(
        "undo: rs1's revision",
        annotation("rs1", "revision"),
        Some("3".into()),
    );
    out.expect_eq(
        "undo: rs1's revision history",
        annotation("rs1", "revision-history"),
        Some("1".into()),
    );
    out.expect_eq(
        "undo: rs2's revision",
        annotation("rs2", "revision"),
        Some("2".into()),
    );
    out.expect_eq(
        "undo: the Deployment's revision",
        s.deployments.get(d).and_then(|dep| {
            dep.annotations()
                .get("deployment.kubernetes.io/revision")
                .cloned()
        }),
        Some("3".into()),
    );
    out.record("2 undo: ReplicaSet sizes", sizes);
    out.record("2 undo: waves of Pods becoming Ready", waves);
    out.record("2 undo: ReplicaSets", rss);
    out.record("2 undo: Deployment", deployment_summary(&s, d));
    out.record("1-2 bound violations", s.violations.len());
    out.no_violations(&s);
    Ok(out)
}

/// Scenario 3: a rollout held mid-way (the new Pods never become Ready), scaled up to 20 and
/// down to 5: the change is split across both ReplicaSets in proportion; then it completes.
pub async fn proportional_scaling(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "prop";
    run.create_deployment(
        &[d, &format!("--image={}", image(d, 1)), "--replicas=10"],
        |m| {
            gate(m, 2);
            strategy(m);
        },
    )
    .await?;
    run.roll_out_in_waves(d).await?;
    let mark = sizes_len(&run.lock(), d);
    run.change_deployment(
        d,
        &[
            "set",
            "image",
            &format!("deployment/{d}"),
            &format!("prop={}", image(d, 2)),
        ],
    )
    .await?;
    run.settled(d).await?;
    let mut held = Vec::new();
    held.push(line(&run.lock().sizes_now(d)));
    for replicas in ["20", "5"] {
        run.change_deployment(
            d,
            &[
                "scale",
                &format!("deployment/{d}"),
                &format!("--replicas={replicas}"),
            ],
        )
        .await?;
        run.settled(d).await?;
        held.push(line(&run.lock().sizes_now(d)));
    }
    out.expect_eq(
        "held mid-rollout, then scaled to 20 and to 5",
        held.clone(),
        strings(&["rs1=8 rs2=5", "rs1=14 rs2=9", "rs1=3 rs2=5"]),
    );
    let status = run.rollout_status(d);
    run.roll_out_in_waves(d).await?;
    status.await??;
    let s = run.lock();
    let sizes = sizes_since(&s, d, mark);
    out.expect_eq(
        "proportional scaling: ReplicaSet sizes at each step",
        sizes.clone(),
        strings(&[
            "rs1=10 rs2=3",
            "rs1=8 rs2=3",
            "rs1=8 rs2=5",
            "rs1=14 rs2=5",
            "rs1=14 rs2=9",
            "rs1=5 rs2=9",
            "rs1=5 rs2=3",
            "rs1=3 rs2=3",
            "rs1=3 rs2=5",
            "rs1=0 rs2=5",
        ]),
    );
    out.record(
        "3 proportional: held states (mid-rollout, at 20, at 5)",
        held,
    );
    out.record("3 proportional: ReplicaSet sizes", sizes);
    out.record("3 proportional: ReplicaSets", replicasets_summary(&s, d));
    out.record("3 proportional: Deployment", deployment_summary(&s, d));
    Ok(out)
}

/// The parts the ranking scenario gives its six Pods, in the order upstream deletes them
/// (RS-6: unassigned, then not Ready, then lower pod-deletion-cost, then more Pods of the same
/// Deployment on the node); `spread` and one of the two `doubled-up` Pods remain.
const PARTS: [&str; 6] = [
    "unscheduled",
    "not-ready",
    "deletion-cost",
    "doubled-up",
    "doubled-up",
    "spread",
];

/// Scenario 4: six Pods placed by the test (a scheduler name nobody serves): one left
/// unscheduled, one Running but not Ready, one with pod-deletion-cost -5, two on one node, one
/// alone; scaled down one at a time, each step must delete exactly the next Pod in ranking order.
pub async fn scale_down_ranking(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "rank";
    run.create_deployment(
        &[d, &format!("--image={}", image(d, 1)), "--replicas=6"],
        |m| {
            m["spec"]["template"]["spec"]["schedulerName"] = json!("kpr-test-placement");
        },
    )
    .await?;
    let names: Vec<String> = run
        .wait_on("six Pods", d, |s, _| {
            let names = active_names(s, d);
            (names.len() == 6).then_some(names)
        })
        .await?
        .into_iter()
        .collect();
    let part: BTreeMap<String, &str> = names.iter().cloned().zip(PARTS).collect();
    let pods = run.pods();
    let annotate = |name: &str, key: &str, value: &str| {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        let pods = pods.clone();
        let name = name.to_string();
        async move {
            pods.patch(&name, &Default::default(), &kube::api::Patch::Merge(patch))
                .await
        }
    };
    // not-ready: kwok leaves it alone; the test reports it Running, not Ready.
    annotate(&names[1], crate::common::GATE.0, crate::common::GATE.1).await?;
    run.bind(&names[1], "kwok-node-0").await?;
    let not_ready = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
    ]}});
    pods.patch_status(
        &names[1],
        &Default::default(),
        &kube::api::Patch::Strategic(not_ready),
    )
    .await?;
    annotate(
        &names[2],
        "controller.kubernetes.io/pod-deletion-cost",
        "-5",
    )
    .await?;
    run.bind(&names[2], "kwok-node-1").await?;
    run.bind(&names[3], "kwok-node-2").await?;
    run.bind(&names[4], "kwok-node-2").await?;
    run.bind(&names[5], &format!("kwok-node-{}", NODES - 1))
        .await?;
    run.wait_on("the Pods placed, kwok's four Ready", d, |s, _| {
        let ready = names
            .iter()
            .filter(|n| s.pods.get(*n).is_some_and(is_ready))
            .count();
        let running = s
            .pods
            .get(&names[1])
            .and_then(|p| p.status.as_ref()?.phase.clone());
        let rs = s
            .replicasets_of(d)
            .first()
            .map(|rs| rs.status.clone().unwrap_or_default());
        (ready == 4
            && running.as_deref() == Some("Running")
            && rs.is_some_and(|st| st.ready_replicas == Some(4) && st.replicas == 6))
        .then_some(())
    })
    .await?;

    let mut steps = Vec::new();
    for replicas in [5usize, 4, 3, 2] {
        let before = active_names(&run.lock(), d);
        run.change_deployment(
            d,
            &[
                "scale",
                &format!("deployment/{d}"),
                &format!("--replicas={replicas}"),
            ],
        )
        .await?;
        let deleted = run
            .wait_on(&format!("{replicas} Pods left"), d, |s, _| {
                let now = active_names(s, d);
                let rs = s.replicasets_of(d).first().map(|rs| {
                    let st = rs.status.clone().unwrap_or_default();
                    st.replicas == replicas as i32
                        && st.observed_generation == rs.metadata.generation
                        && spec_replicas(rs) == replicas as i32
                });
                (now.len() == replicas && rs == Some(true)).then(|| {
                    before
                        .difference(&now)
                        .map(|n| {
                            part.get(n)
                                .copied()
                                .unwrap_or("a Pod the test did not place")
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await?;
        steps.push(deleted);
    }
    out.expect_eq(
        "Pods deleted at each scale-down step (6 -> 5 -> 4 -> 3 -> 2)",
        steps.clone(),
        vec![
            vec!["unscheduled"],
            vec!["not-ready"],
            vec!["deletion-cost"],
            vec!["doubled-up"],
        ],
    );
    out.record("4 ranking: Pods deleted per step", steps);
    Ok(out)
}

/// The deletion of Deployment `d` in etcd-revision order: per kind and step, the first Pod to
/// start terminating, the last Pod to go, and so on.
fn milestones(s: &State, d: &str) -> Vec<String> {
    let mut first: BTreeMap<(String, String), u64> = BTreeMap::new();
    for m in s.milestones.iter().filter(|m| deployment_of(&m.name) == d) {
        let key = (m.kind.to_string(), m.what.clone());
        let entry = first.entry(key).or_insert(m.revision);
        // Pods go one by one: "gone" is when the last one went, any other step when the first
        // one took it.
        *entry = if m.what == "gone" {
            (*entry).max(m.revision)
        } else {
            (*entry).min(m.revision)
        };
    }
    let mut ordered: Vec<((String, String), u64)> = first.into_iter().collect();
    ordered.sort_by_key(|(_, rev)| *rev);
    ordered
        .into_iter()
        .map(|((kind, what), _)| format!("{kind} {what}"))
        .collect()
}

/// What is left of Deployment `d`: one line per kind of object, owners and finalizers, with a
/// count.
fn remains(s: &State, d: &str) -> Vec<String> {
    let mut lines: BTreeMap<String, usize> = BTreeMap::new();
    let mut add = |line: String| *lines.entry(line).or_default() += 1;
    if let Some(dep) = s.deployments.get(d) {
        add(format!("Deployment finalizers {:?}", dep.finalizers()));
    }
    for rs in s.replicasets_of(d) {
        add(format!(
            "ReplicaSet {} replicas {} owners {:?} finalizers {:?}",
            s.role(&rs.name_any()),
            spec_replicas(rs),
            owner_kinds(&rs.metadata),
            rs.finalizers()
        ));
    }
    for p in s.pods_named_after(d) {
        add(format!(
            "Pod active {} owners {:?} finalizers {:?}",
            is_active(p),
            owner_kinds(&p.metadata),
            p.finalizers()
        ));
    }
    lines
        .into_iter()
        .map(|(line, n)| format!("{n} x {line}"))
        .collect()
}

/// Scenario 5: `kubectl delete deployment --cascade=background|foreground|orphan`, each on a
/// Deployment of two kwok Pods: the order the objects go in and what remains.
pub async fn cascading_deletion(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let cases = [
        (
            "bg",
            "background",
            strings(&[
                "Deployment gone",
                "ReplicaSet gone",
                "Pod deleting []",
                "Pod gone",
            ]),
            Vec::new(),
        ),
        (
            "fg",
            "foreground",
            strings(&[
                r#"Deployment deleting ["foregroundDeletion"]"#,
                r#"ReplicaSet deleting ["foregroundDeletion"]"#,
                "Pod deleting []",
                "Pod gone",
                "ReplicaSet gone",
                "Deployment gone",
            ]),
            Vec::new(),
        ),
        (
            "orphan",
            "orphan",
            strings(&[
                r#"Deployment deleting ["orphan"]"#,
                "ReplicaSet released",
                "Deployment gone",
            ]),
            strings(&[
                r#"2 x Pod active true owners ["ReplicaSet"] finalizers []"#,
                "1 x ReplicaSet rs1 replicas 2 owners [] finalizers []",
            ]),
        ),
    ];
    for (d, _, _, _) in &cases {
        run.kubectl(&[
            "create",
            "deployment",
            d,
            &format!("--image={}", image(d, 1)),
            "--replicas=2",
        ])
        .await?;
    }
    for (d, _, _, _) in &cases {
        run.wait_complete(d).await?;
    }
    for (d, cascade, want_order, want_remains) in cases {
        run.kubectl(&[
            "delete",
            "deployment",
            d,
            &format!("--cascade={cascade}"),
            &format!("--timeout={}s", super::harness::WAIT.as_secs()),
        ])
        .await?;
        run.wait_on(
            &format!("what --cascade={cascade} leaves of {d}"),
            d,
            |s, _| {
                let done = !s.deployments.contains_key(d)
                    && if cascade == "orphan" {
                        let rss = s.replicasets_of(d);
                        rss.len() == 1
                            && rss[0].owner_references().is_empty()
                            && rss[0].finalizers().is_empty()
                            && s.active_pods_of_rs(&rss[0].name_any()).len() == 2
                    } else {
                        s.replicasets_of(d).is_empty() && s.pods_named_after(d).is_empty()
                    };
                done.then_some(())
            },
        )
        .await?;
        let s = run.lock();
        let order = milestones(&s, d);
        let left = remains(&s, d);
        out.expect_eq(
            &format!("--cascade={cascade}: deletion order"),
            order.clone(),
            want_order,
        );
        out.expect_eq(
            &format!("--cascade={cascade}: what remains"),
            left.clone(),
            want_remains,
        );
        out.record(&format!("5 cascade={cascade}: deletion order"), order);
        out.record(&format!("5 cascade={cascade}: remains"), left);
    }
    Ok(out)
}

/// Scenario 6: a Pod relabelled out of its ReplicaSet's selector is released (its
/// ownerReference removed, the Pod kept) and replaced by exactly one new Pod.
pub async fn release_relabelled_pod(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "rel";
    run.kubectl(&[
        "create",
        "deployment",
        d,
        &format!("--image={}", image(d, 1)),
        "--replicas=3",
    ])
    .await?;
    run.wait_complete(d).await?;
    let (pod, mark) = {
        let s = run.lock();
        let pod = active_names(&s, d).into_iter().next().expect("three Pods");
        (pod, s.pods_added.len())
    };
    run.kubectl(&["label", "pod", &pod, "app=released", "--overwrite"])
        .await?;
    run.wait_on("the Pod released and replaced", d, |s, _| {
        let released = s
            .pods
            .get(&pod)
            .is_some_and(|p| is_active(p) && controller_rs(p).is_none());
        let rs = s.replicasets_of(d);
        let replaced = rs.len() == 1 && {
            let st = rs[0].status.clone().unwrap_or_default();
            s.active_pods_of_rs(&rs[0].name_any()).len() == 3
                && st.replicas == 3
                && st.available_replicas == Some(3)
        };
        (released && replaced && rollout_complete(s, d)).then_some(())
    })
    .await?;
    let s = run.lock();
    let p = &s.pods[&pod];
    let created = s.pods_added.len() - mark;
    let owners = owner_kinds(&p.metadata);
    let labels: BTreeSet<String> = p.labels().keys().cloned().collect();
    out.expect_eq(
        "the released Pod's owners",
        owners.clone(),
        Vec::<String>::new(),
    );
    out.expect_eq("Pods created after the relabel", created, 1);
    let rs = s.replicasets_of(d)[0].status.clone().unwrap_or_default();
    out.record("6 release: the released Pod's owners", owners);
    out.record("6 release: the released Pod's label keys", labels);
    out.record("6 release: Pods created after the relabel", created);
    out.record(
        "6 release: ReplicaSet status (replicas, fullyLabeled, ready, available)",
        (
            rs.replicas,
            rs.fully_labeled_replicas,
            rs.ready_replicas,
            rs.available_replicas,
        ),
    );
    out.record("6 release: Deployment", deployment_summary(&s, d));
    Ok(out)
}

/// Scenario 7: the controller manager SIGKILLed just after the new ReplicaSet's first Pod
/// appeared and started again; the rollout completes with the same steps and exactly the ten new
/// Pods it needs.
pub async fn restart_mid_rollout(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "web";
    run.create_deployment(
        &[d, &format!("--image={}", image(d, 1)), "--replicas=10"],
        |m| {
            gate(m, 2);
            strategy(m);
        },
    )
    .await?;
    run.roll_out_in_waves(d).await?;
    let (mark, added) = {
        let mut s = run.lock();
        s.bounds.insert(
            d.into(),
            Bounds {
                max_total: 13,
                min_available: 8,
                min_ready_seconds: 2,
            },
        );
        (sizes_len(&s, d), s.pods_added.len())
    };
    run.change_deployment(
        d,
        &[
            "set",
            "image",
            &format!("deployment/{d}"),
            &format!("web={}", image(d, 2)),
        ],
    )
    .await?;
    let at_kill = run
        .wait_on("the new ReplicaSet's first Pod", d, |s, _| {
            (s.pods_added.len() > added).then(|| line(&s.sizes_now(d)))
        })
        .await?;
    run.cluster.kill_manager()?;
    let created_before_kill = run.lock().pods_added.len() - added;
    run.cluster.restart_manager()?;
    let status = run.rollout_status(d);
    run.roll_out_in_waves(d).await?;
    status.await??;
    let s = run.lock();
    let new_pods: Vec<&String> = s.pods_added[added..].iter().collect();
    let by_rs: BTreeMap<String, usize> = new_pods.iter().fold(BTreeMap::new(), |mut m, name| {
        let rs = s
            .pods
            .get(*name)
            .and_then(controller_rs)
            .map(|rs| s.role(rs))
            .unwrap_or_else(|| "gone".into());
        *m.entry(rs).or_default() += 1;
        m
    });
    out.expect_eq(
        "Pods created during the rollout, per ReplicaSet",
        by_rs.clone(),
        BTreeMap::from([("rs2".to_string(), 10)]),
    );
    out.expect_eq(
        "ReplicaSet sizes at each step",
        sizes_since(&s, d, mark),
        strings(&[
            "rs1=10 rs2=3",
            "rs1=8 rs2=3",
            "rs1=8 rs2=5",
            "rs1=3 rs2=5",
            "rs1=3 rs2=10",
            "rs1=0 rs2=10",
        ]),
    );
    out.record("7 restart: sizes when killed", at_kill);
    out.record(
        "7 restart: Pods created before the kill",
        created_before_kill,
    );
    out.record("7 restart: Pods created per ReplicaSet", by_rs);
    out.no_violations(&s);
    Ok(out)
}

/// A Deployment's status as issue 37 reads it: replicas, availableReplicas, whether the
/// generation is observed, and the Progressing condition (status, reason).
fn paused_status(s: &State, d: &str) -> Value {
    let Some(dep) = s.deployments.get(d) else {
        return Value::Null;
    };
    let st = dep.status.clone().unwrap_or_default();
    let progressing = conditions(dep)
        .into_iter()
        .find(|(t, ..)| t == "Progressing")
        .map(|(_, status, reason, _)| [status, reason]);
    json!({
        "replicas": st.replicas,
        "availableReplicas": st.available_replicas,
        "generationObserved": st.observed_generation == dep.metadata.generation,
        "progressing": progressing,
    })
}

/// Scenario 8 (issue 37): a Deployment of 1 available replica is patched `paused: true,
/// replicas: 0` in one go: its ReplicaSet goes to 0, replicas and availableReplicas are dropped,
/// the generation is observed and Progressing is Unknown DeploymentPaused; a template change
/// while paused is observed and rolls nothing out. A Deployment created with 0 replicas and then
/// paused gets the same condition. (kpr panicked on every sync of the first.)
pub async fn paused_at_zero(run: &Run) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let d = "paused";
    run.create_deployment(
        &[d, &format!("--image={}", image(d, 1)), "--replicas=1"],
        |_| {},
    )
    .await?;
    run.settled(d).await?;
    let patch = r#"{"spec":{"paused":true,"replicas":0}}"#;
    run.change_deployment(
        d,
        &[
            "patch",
            &format!("deployment/{d}"),
            "--type=merge",
            "-p",
            patch,
        ],
    )
    .await?;
    run.settled(d).await?;
    let at_zero = paused_status(&run.lock(), d);
    run.change_deployment(
        d,
        &[
            "set",
            "image",
            &format!("deployment/{d}"),
            &format!("{d}={}", image(d, 2)),
        ],
    )
    .await?;
    run.settled(d).await?;
    let (changed, replicasets) = {
        let s = run.lock();
        (paused_status(&s, d), s.replicasets_of(d).len())
    };
    let z = "zero";
    run.create_deployment(
        &[z, &format!("--image={}", image(z, 1)), "--replicas=0"],
        |_| {},
    )
    .await?;
    run.settled(z).await?;
    run.change_deployment(
        z,
        &[
            "patch",
            &format!("deployment/{z}"),
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ],
    )
    .await?;
    run.settled(z).await?;
    let zero = paused_status(&run.lock(), z);
    let want = json!({"replicas": null, "availableReplicas": null, "generationObserved": true,
                      "progressing": ["Unknown", "DeploymentPaused"]});
    out.expect_eq("paused with replicas 0", at_zero.clone(), want.clone());
    out.expect_eq(
        "then a template change while paused",
        changed.clone(),
        want.clone(),
    );
    out.expect_eq("no ReplicaSet made while paused", replicasets, 1);
    out.expect_eq("created at 0, then paused", zero.clone(), want);
    out.record("8 paused at zero: paused with replicas 0", at_zero);
    out.record("8 paused at zero: a template change while paused", changed);
    out.record("8 paused at zero: ReplicaSets", replicasets);
    out.record("8 paused at zero: created at 0, then paused", zero);
    Ok(out)
}
