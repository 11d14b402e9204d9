//! Table-driven tests of the StatefulSet plan, named after the STS rule IDs.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use super::plan::{self, Action, Inputs, UpdateRevision};
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::history;

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

fn set(replicas: i32, extra: Value) -> StatefulSet {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "set-uid", "generation": 2},
        "spec": {
            "replicas": replicas,
            "serviceName": "nginx",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}],
                         "volumes": [{"name": "scratch", "emptyDir": {}}]}
            },
            "volumeClaimTemplates": [{"metadata": {"name": "www"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "revisionHistoryLimit": 10
        }
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn with_image(s: &StatefulSet, image: &str) -> StatefulSet {
    let mut s = s.clone();
    crate::runtime::testing::set_template_image(&mut s.spec.as_mut().unwrap().template, image);
    s
}

fn rev(s: &StatefulSet, n: i64) -> ControllerRevision {
    plan::new_revision(s, n, 0).unwrap()
}

fn now() -> Timestamp {
    Timestamp::from_second(1_000_000).unwrap()
}

/// A Pod of a test world: ordinal, at the update revision, state.
type PodSpec = (i64, bool, St);

#[derive(Clone, Copy, PartialEq)]
enum St {
    Ready,
    /// Ready, but only since `now` (not available under minReadySeconds).
    JustReady,
    Running,
    Pending,
    Failed,
    Terminating,
}

fn pod(s: &StatefulSet, ord: i64, revision: &str, st: St) -> Arc<CachedPod> {
    let mut p = plan::new_pod(s, ord);
    p.metadata.uid = Some(format!("pod-uid-{ord}"));
    p.metadata.resource_version = Some("1".into());
    p.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(plan::REVISION_LABEL.into(), revision.into());
    let (phase, ready) = match st {
        St::Ready | St::JustReady | St::Terminating => ("Running", true),
        St::Running => ("Running", false),
        St::Pending => ("Pending", false),
        St::Failed => ("Failed", false),
    };
    let since = if st == St::JustReady {
        now()
    } else {
        now() - SignedDuration::from_secs(3600)
    };
    p.status = Some(
        serde_json::from_value(json!({
            "phase": phase,
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                            "lastTransitionTime": since.to_string()}]
        }))
        .unwrap(),
    );
    if st == St::Terminating {
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    }
    Arc::new(CachedPod::from(p))
}

fn claim(name: &str, refs: Value, deleting: bool) -> Arc<PersistentVolumeClaim> {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                                    "resourceVersion": "5", "ownerReferences": refs}});
    if deleting {
        v["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
    }
    Arc::new(serde_json::from_value(v).unwrap())
}

fn describe(u: &plan::Update) -> Vec<String> {
    u.passes
        .iter()
        .flatten()
        .flatten()
        .map(|a| match a {
            Action::CreateClaim { claim, .. } => {
                format!("create-claim {}", claim.metadata.name.as_deref().unwrap())
            }
            Action::ClaimTerminating { claim } => format!("claim-terminating {claim}"),
            Action::SetClaimOwners { claim, refs, .. } => format!(
                "owners {} [{}]",
                claim.metadata.name.as_deref().unwrap(),
                refs.iter()
                    .map(|r| format!("{}/{}", r.kind, r.name))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Action::ConflictingController { claim } => format!("conflict {claim}"),
            Action::CreatePod(p) => format!(
                "create {}@{}",
                p.metadata.name.as_deref().unwrap(),
                plan::pod_revision(&CachedPod::from(p.as_ref()))
            ),
            Action::DeletePod { pod, reason } => {
                format!(
                    "delete {} {reason:?}",
                    pod.metadata.name.as_deref().unwrap()
                )
            }
            Action::SetIdentity { pod, .. } => {
                format!("identity {}", pod.metadata.name.as_deref().unwrap())
            }
            Action::SetStorage { pod, .. } => {
                format!("storage {}", pod.metadata.name.as_deref().unwrap())
            }
            Action::PodUpdated { pod } => format!("updated {pod}"),
        })
        .collect()
}

struct World {
    set: StatefulSet,
    pods: Vec<Arc<CachedPod>>,
    current: ControllerRevision,
    update: ControllerRevision,
    claims: Vec<Arc<PersistentVolumeClaim>>,
}

impl World {
    fn run(&self) -> plan::Update {
        let claims = self.claims.clone();
        let lookup = move |n: &str| {
            claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(n))
                .cloned()
        };
        plan::update(&Inputs {
            set: &self.set,
            pods: &self.pods,
            current: &self.current,
            update: &self.update,
            collision_count: 0,
            claim: &lookup,
            now: now(),
        })
        .unwrap()
    }
}

/// A world where every ordinal's claim exists (Retain policy: no owners).
fn world(s: StatefulSet, pods: &[(i64, bool, St)]) -> World {
    let old = rev(&s, 1);
    let new = rev(&with_image(&s, "nginx:2"), 2);
    let name = |r: &ControllerRevision| r.metadata.name.clone().unwrap();
    let (cur_name, upd_name) = (name(&old), name(&new));
    // An unchanged template: the update revision is the current one.
    let pods = pods
        .iter()
        .map(|(o, updated, st)| pod(&s, *o, if *updated { &upd_name } else { &cur_name }, *st))
        .collect();
    let claims = (0..10)
        .map(|o| claim(&format!("www-web-{o}"), json!([]), false))
        .collect();
    World {
        set: s,
        pods,
        current: old,
        update: new,
        claims,
    }
}

/// The template is unchanged: the update revision is the current one, every Pod at it.
fn same_revision(mut w: World) -> World {
    w.update = w.current.clone();
    let name = w.current.metadata.name.clone().unwrap();
    for p in w.pods.iter_mut() {
        let mut q = (**p).clone();
        q.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(plan::REVISION_LABEL.into(), name.clone());
        *p = Arc::new(q);
    }
    w
}

#[test]
fn sts2_names_and_ordinals() {
    let cases: &[(&str, &str, (&str, i64))] = &[
        ("STS-2 web-0 is ordinal 0 of web", "web-0", ("web", 0)),
        ("STS-2 the last hyphen splits", "my-web-12", ("my-web", 12)),
        ("STS-2 leading zeros parse", "web-007", ("web", 7)),
        ("STS-2 no digits: no parent", "web-x", ("", -1)),
        ("STS-2 no hyphen: no parent", "web0", ("", -1)),
        (
            "STS-2 beyond 32 bits: a member without ordinal",
            "web-99999999999",
            ("web", -1),
        ),
    ];
    for (name, pod, want) in cases {
        assert_eq!(plan::parent_and_ordinal(pod), *want, "{name}");
    }
    let s = set(3, json!({}));
    assert_eq!(plan::claim_name(&s, "www", 2), "www-web-2");
}

#[test]
fn sts10_new_pod_has_identity_storage_and_controller() {
    let s = set(
        3,
        json!({"spec": {"template": {"spec": {"volumes": [
        {"name": "www", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}]}}}}),
    );
    let p = plan::new_pod(&s, 1);
    let labels = p.metadata.labels.clone().unwrap();
    let cases: &[(&str, Option<&str>, Option<&str>)] = &[
        ("STS-10 name", p.metadata.name.as_deref(), Some("web-1")),
        (
            "STS-10 generateName as GetPodFromTemplate",
            p.metadata.generate_name.as_deref(),
            Some("web-"),
        ),
        (
            "STS-10 template labels kept",
            labels.get("app").map(String::as_str),
            Some("web"),
        ),
        (
            "STS-10 pod-name label",
            labels.get(plan::POD_NAME_LABEL).map(String::as_str),
            Some("web-1"),
        ),
        (
            "STS-10 pod-index label",
            labels.get(plan::POD_INDEX_LABEL).map(String::as_str),
            Some("1"),
        ),
        (
            "STS-10 hostname",
            p.spec.as_ref().unwrap().hostname.as_deref(),
            Some("web-1"),
        ),
        (
            "STS-10 subdomain is the service",
            p.spec.as_ref().unwrap().subdomain.as_deref(),
            Some("nginx"),
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, want, "{name}");
    }
    let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("StatefulSet", "set-uid", Some(true))
    );
    let vols: Vec<_> = p
        .spec
        .unwrap()
        .volumes
        .unwrap()
        .into_iter()
        .map(|v| (v.name, v.persistent_volume_claim.map(|c| c.claim_name)))
        .collect();
    assert_eq!(
        vols,
        [
            ("www".to_string(), Some("www-web-1".to_string())),
            ("scratch".to_string(), None)
        ],
        "STS-10 a template volume named like a claim template is replaced, others kept"
    );
    let claims = plan::pod_claims(&s, 1);
    assert_eq!(claims.len(), 1);
    let c = &claims[0].1;
    assert_eq!(c.metadata.name.as_deref(), Some("www-web-1"));
    assert_eq!(
        c.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("app")
            .map(String::as_str),
        Some("web"),
        "STS-2 claims carry the selector's labels"
    );
    assert!(
        c.metadata.owner_references.is_none(),
        "STS-11 Retain: no owner, kept on delete"
    );
}

#[test]
fn sts7_replica_pass_ordered_ready() {
    let s = set(3, json!({}));
    use St::*;
    let cases: Vec<(&str, Vec<PodSpec>, Vec<&str>)> = vec![
        (
            "STS-7 empty set creates web-0 only, its claim first",
            vec![],
            vec!["create-claim www-web-0", "create web-0@U"],
        ),
        (
            "STS-5 a Pending web-0 blocks web-1",
            vec![(0, true, Pending)],
            vec![],
        ),
        (
            "STS-5 a Running but not Ready web-0 blocks",
            vec![(0, true, Running)],
            vec![],
        ),
        (
            "STS-7 web-0 Ready: web-1 is next",
            vec![(0, true, Ready)],
            vec!["create-claim www-web-1", "create web-1@U"],
        ),
        (
            "STS-7 a gap is filled in order",
            vec![(0, true, Ready), (2, true, Ready)],
            vec!["create-claim www-web-1", "create web-1@U"],
        ),
        (
            "STS-7 a Failed Pod is deleted and nothing else",
            vec![(0, true, Failed), (1, true, Ready)],
            vec!["delete web-0 Finished"],
        ),
        (
            "STS-7 a terminating Pod blocks",
            vec![(0, true, Terminating)],
            vec![],
        ),
        (
            "STS-7 all Ready: nothing to do",
            vec![(0, true, Ready), (1, true, Ready), (2, true, Ready)],
            vec![],
        ),
    ];
    for (name, pods, want) in cases {
        let mut w = same_revision(world(s.clone(), &pods));
        w.claims.clear();
        for (o, _, _) in &pods {
            w.claims
                .push(claim(&format!("www-web-{o}"), json!([]), false));
        }
        let upd = w.update.metadata.name.clone().unwrap();
        let got: Vec<_> = describe(&w.run())
            .into_iter()
            .map(|d| d.replace(&upd, "U"))
            .collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn sts5_parallel_creates_and_deletes_without_waiting() {
    use St::*;
    let s = set(3, json!({"spec": {"podManagementPolicy": "Parallel"}}));
    let mut w = same_revision(world(s, &[(0, true, Pending), (4, true, Running)]));
    w.claims.clear();
    let upd = w.update.metadata.name.clone().unwrap();
    let u = w.run();
    assert!(u.parallel);
    let got: Vec<_> = describe(&u)
        .into_iter()
        .map(|d| d.replace(&upd, "U"))
        .collect();
    assert_eq!(
        got,
        [
            "create-claim www-web-0",
            "create-claim www-web-1",
            "create web-1@U",
            "create-claim www-web-2",
            "create web-2@U",
            "delete web-4 Condemned"
        ],
        "Parallel: a Pending Pod gets its missing claim, every gap is created, condemned deleted"
    );
    assert_eq!(u.passes.len(), 2, "replica pass, then condemned pass");
}

#[test]
fn sts8_condemned_pass_descending_one_at_a_time() {
    use St::*;
    let s = set(1, json!({}));
    let cases: Vec<(&str, Vec<PodSpec>, Vec<&str>)> = vec![
        (
            "STS-8 the highest ordinal goes first",
            vec![(0, true, Ready), (1, true, Ready), (2, true, Ready)],
            vec!["delete web-2 Condemned"],
        ),
        (
            "STS-8 a terminating condemned Pod blocks",
            vec![(0, true, Ready), (1, true, Ready), (2, true, Terminating)],
            vec![],
        ),
        (
            "STS-8 the first unhealthy Pod may go",
            vec![(0, true, Ready), (1, true, Running)],
            vec!["delete web-1 Condemned"],
        ),
        (
            "STS-8 an unhealthy Pod that is not the first blocks",
            vec![(0, true, Ready), (1, true, Running), (2, true, Running)],
            vec![],
        ),
        (
            "STS-8 replicas must be healthy first",
            vec![(0, true, Pending), (1, true, Ready)],
            vec![],
        ),
    ];
    for (name, pods, want) in cases {
        let w = same_revision(world(s.clone(), &pods));
        assert_eq!(describe(&w.run()), want, "{name}");
    }
}

#[test]
fn sts9_rolling_update_highest_first_down_to_partition() {
    use St::*;
    // (name, spec patch, Pods, actions, currentReplicas)
    type Case<'a> = (&'a str, Value, Vec<PodSpec>, Vec<&'a str>, i32);
    let cases: Vec<Case> = vec![
        (
            "STS-9 partition 0: web-2 first",
            json!({}),
            vec![(0, false, Ready), (1, false, Ready), (2, false, Ready)],
            vec!["delete web-2 Update"],
            2,
        ),
        (
            "STS-9 web-2 updated and Ready: web-1 next",
            json!({}),
            vec![(0, false, Ready), (1, false, Ready), (2, true, Ready)],
            vec!["delete web-1 Update"],
            1,
        ),
        (
            "STS-9 an unhealthy updated Pod is waited for",
            json!({}),
            vec![(0, false, Ready), (1, false, Ready), (2, true, Running)],
            vec![],
            2,
        ),
        (
            "STS-9 partition 2: only web-2",
            json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}),
            vec![(0, false, Ready), (1, false, Ready), (2, true, Ready)],
            vec![],
            2,
        ),
        (
            "STS-9 partition 2 starts at web-2",
            json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}),
            vec![(0, false, Ready), (1, false, Ready), (2, false, Ready)],
            vec!["delete web-2 Update"],
            2,
        ),
        (
            "OnDelete never deletes for an update",
            json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}),
            vec![(0, false, Ready), (1, false, Ready), (2, false, Ready)],
            vec![],
            3,
        ),
    ];
    for (name, extra, pods, want, current) in cases {
        let w = world(set(3, extra), &pods);
        let u = w.run();
        assert_eq!(describe(&u), want, "{name}");
        assert_eq!(
            u.status.current_replicas,
            Some(current),
            "{name}: currentReplicas"
        );
    }
}

#[test]
fn sts6_missing_ordinals_are_built_at_the_partitioned_revision() {
    use St::*;
    let s = set(
        3,
        json!({"spec": {"podManagementPolicy": "Parallel",
        "updateStrategy": {"rollingUpdate": {"partition": 2}}}}),
    );
    let mut w = world(s, &[(1, false, Ready)]);
    w.claims.clear();
    let (cur, upd) = (
        w.current.metadata.name.clone().unwrap(),
        w.update.metadata.name.clone().unwrap(),
    );
    let got: Vec<_> = describe(&w.run())
        .into_iter()
        .filter(|d| d.starts_with("create web"))
        .map(|d| d.replace(&cur, "C").replace(&upd, "U"))
        .collect();
    assert_eq!(
        got,
        ["create web-0@C", "create web-2@U"],
        "STS-6 below the partition: current revision"
    );
}

#[test]
fn sts_min_ready_seconds_gates_progress_and_availability() {
    use St::*;
    let s = set(2, json!({"spec": {"minReadySeconds": 10}}));
    let w = same_revision(world(s.clone(), &[(0, true, JustReady)]));
    let u = w.run();
    assert_eq!(
        describe(&u),
        Vec::<String>::new(),
        "Ready but not yet available blocks web-1"
    );
    assert_eq!(
        (u.status.ready_replicas, u.status.available_replicas),
        (Some(1), Some(0))
    );
    let w = same_revision(world(s, &[(0, true, Ready)]));
    let u = w.run();
    assert_eq!(describe(&u).len(), 1, "available: web-1 is created");
    assert_eq!(u.status.available_replicas, Some(1));
}

#[test]
fn sts11_a_set_being_deleted_only_gets_status() {
    use St::*;
    let mut s = set(3, json!({}));
    s.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let w = same_revision(world(s, &[(0, true, Ready), (5, true, Ready)]));
    let u = w.run();
    assert!(describe(&u).is_empty());
    assert_eq!(u.status.replicas, 2);
}

#[test]
fn status_fields_and_completion() {
    use St::*;
    let w = world(
        set(3, json!({})),
        &[(0, false, Ready), (1, true, Ready), (2, true, Ready)],
    );
    let u = w.run();
    let st = &u.status;
    assert_eq!(
        (
            st.replicas,
            st.ready_replicas,
            st.current_replicas,
            st.updated_replicas,
            st.available_replicas
        ),
        (3, Some(3), Some(0), Some(2), Some(3)),
        "web-0 is deleted for the update: currentReplicas drops by one"
    );
    assert_eq!(st.observed_generation, Some(2));
    assert_eq!(st.collision_count, Some(0));
    let mut done = st.clone();
    done.updated_replicas = Some(3);
    plan::complete_rolling_update(&w.set, &mut done);
    assert_eq!(
        done.current_revision, done.update_revision,
        "all updated and ready: the update revision is current"
    );
    assert_eq!(done.current_replicas, Some(3));
    let mut s = w.set.clone();
    s.status = Some(done.clone());
    assert!(!plan::needs_status_update(&s, &done));
    let mut changed = done.clone();
    changed.collision_count = Some(4);
    assert!(
        !plan::needs_status_update(&s, &changed),
        "upstream does not write a collision count alone"
    );
    changed.ready_replicas = Some(2);
    assert!(plan::needs_status_update(&s, &changed));
}

#[test]
fn sts_retention_policy_owner_references() {
    let set_ref = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "set-uid", "controller": true, "blockOwnerDeletion": true});
    let pod_ref = |uid: &str| json!({"apiVersion": "v1", "kind": "Pod", "name": "web-2", "uid": uid, "controller": true, "blockOwnerDeletion": true});
    let cases: Vec<(&str, &str, &str, i32, Value, bool, &str)> = vec![
        (
            "Retain/Retain: no owners",
            "Retain",
            "Retain",
            3,
            json!([]),
            true,
            "",
        ),
        (
            "Retain/Retain: a set owner is removed",
            "Retain",
            "Retain",
            3,
            json!([set_ref]),
            false,
            "",
        ),
        (
            "WhenDeleted=Delete: the set owns it",
            "Delete",
            "Retain",
            3,
            json!([]),
            false,
            "StatefulSet/web",
        ),
        (
            "WhenScaled=Delete, in range: no owner",
            "Retain",
            "Delete",
            3,
            json!([]),
            true,
            "",
        ),
        (
            "WhenScaled=Delete, scaled away: the Pod owns it",
            "Retain",
            "Delete",
            2,
            json!([]),
            false,
            "Pod/web-2",
        ),
        (
            "Delete/Delete, in range: the set",
            "Delete",
            "Delete",
            3,
            json!([pod_ref("pod-uid-2")]),
            false,
            "StatefulSet/web",
        ),
        (
            "Delete/Delete, scaled away: the Pod only",
            "Delete",
            "Delete",
            2,
            json!([set_ref]),
            false,
            "Pod/web-2",
        ),
        (
            "a stale Pod reference is left alone",
            "Retain",
            "Delete",
            2,
            json!([pod_ref("old")]),
            true,
            "Pod/web-2",
        ),
    ];
    for (name, when_deleted, when_scaled, replicas, refs, up_to_date, want) in cases {
        let s = set(
            replicas,
            json!({"spec": {"persistentVolumeClaimRetentionPolicy":
            {"whenDeleted": when_deleted, "whenScaled": when_scaled}}}),
        );
        let p = pod(&s, 2, "r", St::Ready);
        let c = claim("www-web-2", refs, false);
        assert_eq!(
            plan::claim_owner_up_to_date(&c, &s, &p),
            up_to_date,
            "{name}: up to date"
        );
        if !up_to_date {
            let got: Vec<_> = plan::claim_owner_refs(&c, &s, &p)
                .iter()
                .map(|r| format!("{}/{}", r.kind, r.name))
                .collect();
            assert_eq!(got.join(","), want, "{name}: references");
        }
    }
}

#[test]
fn sts_retention_policy_in_the_sync() {
    use St::*;
    // WhenScaled=Delete: scaling 3 -> 2 gives web-2's claim to web-2 before web-2 goes.
    let s = set(
        2,
        json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Delete"}}}),
    );
    let w = same_revision(world(
        s.clone(),
        &[(0, true, Ready), (1, true, Ready), (2, true, Ready)],
    ));
    assert_eq!(
        describe(&w.run()),
        ["owners www-web-2 [Pod/web-2]", "delete web-2 Condemned"]
    );
    // A claim still owned by an earlier web-1 blocks creating the new web-1.
    let mut w = same_revision(world(s.clone(), &[(0, true, Ready)]));
    w.claims = vec![claim(
        "www-web-1",
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "web-1", "uid": "gone", "controller": true}]),
        false,
    )];
    assert!(
        describe(&w.run()).is_empty(),
        "stale claim: wait for the garbage collector"
    );
    // A claim being deleted fails the creation step (the Pod is not created).
    let mut w = same_revision(world(set(1, json!({})), &[]));
    w.claims = vec![claim("www-web-0", json!([]), true)];
    let upd = w.update.metadata.name.clone().unwrap();
    let got: Vec<_> = describe(&w.run())
        .into_iter()
        .map(|d| d.replace(&upd, "U"))
        .collect();
    assert_eq!(got, ["claim-terminating www-web-0", "create web-0@U"]);
}

#[test]
fn sts7_identity_is_restored_on_a_relabelled_pod() {
    let s = set(1, json!({}));
    let w = same_revision(world(s, &[(0, true, St::Ready)]));
    let mut p = (*w.pods[0]).clone();
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(plan::POD_NAME_LABEL);
    let w = World {
        pods: vec![Arc::new(p)],
        ..w
    };
    assert_eq!(describe(&w.run()), ["identity web-0", "updated web-0"]);
}

#[test]
fn sts4_revisions_existing_rollback_and_new() {
    let s1 = set(3, json!({}));
    let s2 = with_image(&s1, "nginx:2");
    let arc = |r: ControllerRevision| Arc::new(r);
    let (r1, r2) = (arc(rev(&s1, 1)), arc(rev(&s2, 2)));
    let sorted = vec![r1.clone(), r2.clone()];
    match plan::revisions(&s2, &sorted).unwrap().update {
        UpdateRevision::Existing(r) => assert_eq!(
            r.metadata.name, r2.metadata.name,
            "STS-4 unchanged template: newest"
        ),
        other => panic!("STS-4 unchanged: {other:?}"),
    }
    match plan::revisions(&s1, &sorted).unwrap().update {
        UpdateRevision::Renumber(r, n) => {
            assert_eq!(
                (r.metadata.name.clone(), n),
                (r1.metadata.name.clone(), 3),
                "STS-4 rollback renumbers the old revision"
            )
        }
        other => panic!("STS-4 rollback: {other:?}"),
    }
    let s3 = with_image(&s1, "nginx:3");
    match plan::revisions(&s3, &sorted).unwrap().update {
        UpdateRevision::Create(r) => assert_eq!(r.revision, 3, "STS-4 a new template: next number"),
        other => panic!("STS-4 new: {other:?}"),
    }
    let mut s = s2.clone();
    s.status = Some(
        serde_json::from_value(
            json!({"replicas": 3, "currentRevision": r1.metadata.name, "collisionCount": 2}),
        )
        .unwrap(),
    );
    let d = plan::revisions(&s, &sorted).unwrap();
    assert_eq!(
        d.current.unwrap().metadata.name,
        r1.metadata.name,
        "STS-4 current from status"
    );
    assert_eq!(d.collision_count, 2);
    // Truncation keeps live revisions.
    let s_lim = set(3, json!({"spec": {"revisionHistoryLimit": 0}}));
    let gone = plan::revisions_to_truncate(
        &s_lim,
        &[],
        &sorted,
        r2.metadata.name.as_deref(),
        r2.metadata.name.as_deref(),
    );
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].metadata.name, r1.metadata.name);
}

#[test]
fn sts4_revision_data_is_the_template_as_go_encodes_it() {
    let s = set(3, json!({}));
    let data = plan::revision_data(&s).unwrap();
    let t = &data["spec"]["template"];
    assert_eq!(t["$patch"], json!("replace"));
    assert!(
        !t["metadata"]
            .as_object()
            .unwrap()
            .contains_key("creationTimestamp"),
        "v1.34 omits the zero creationTimestamp"
    );
    let r = rev(&s, 1);
    let h = history::hash(&data, Some(0));
    assert_eq!(r.metadata.name, Some(format!("web-{h}")));
    assert_eq!(
        r.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("app")
            .map(String::as_str),
        Some("web"),
        "template labels"
    );
    let back = plan::apply_revision(&with_image(&s, "other"), &r).unwrap();
    assert_eq!(
        back.spec.unwrap().template,
        s.spec.unwrap().template,
        "ApplyRevision restores the template"
    );
}

#[test]
fn sts4_revision_names_equal_kube_controller_managers() {
    // A template as the API server defaults it; kube-controller-manager v1.34.4 named its
    // revision web-667f67c5d5 (collision count 0) in a run of the e2e test.
    let s: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "serviceName": "nginx",
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{"image": "registry.k8s.io/nginx:1",
                        "imagePullPolicy": "IfNotPresent", "name": "nginx", "resources": {},
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File"}],
                    "dnsPolicy": "ClusterFirst", "nodeName": "kwok-node-0",
                    "restartPolicy": "Always", "schedulerName": "default-scheduler",
                    "securityContext": {}, "terminationGracePeriodSeconds": 30
                }
            }
        }
    }))
    .unwrap();
    let name = |collisions| plan::new_revision(&s, 1, collisions).unwrap().metadata.name;
    assert_eq!(name(0).as_deref(), Some("web-667f67c5d5"));
    assert_ne!(name(1), name(0), "the collision count moves the name");
}
