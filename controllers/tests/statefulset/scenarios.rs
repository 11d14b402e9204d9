//! The StatefulSet scenarios. Each returns a record of what is observable and the same for
//! either controller manager (names, orders, labels, owners, statuses, event reasons; never
//! uids or times) and the expectations it broke. docs/WORKLOADS.md lists what they prove.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt as _;
use serde_json::{json, Value};

use super::harness::{ready, rv, Run, Seen, State, GATE, NODE};

/// A scenario's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What both flavours must agree on.
    pub record: Value,
    /// Broken expectations.
    pub problems: Vec<String>,
}

/// The set `web`: `replicas` nginx Pods on the kwok node, one `www` claim each, `extra` merged
/// into the spec.
fn web(replicas: i32, extra: Value) -> StatefulSet {
    let mut v = json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "serviceName": "nginx",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {GATE.0: GATE.1}},
                "spec": {"nodeName": NODE,
                         "containers": [{"name": "nginx", "image": "registry.k8s.io/nginx:1"}]}
            },
            "volumeClaimTemplates": [{"metadata": {"name": "www"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    });
    if let (Some(spec), Value::Object(extra)) = (v["spec"].as_object_mut(), extra) {
        spec.extend(extra);
    }
    serde_json::from_value(v).expect("a valid StatefulSet")
}

async fn create(run: &Run, set: &StatefulSet) -> anyhow::Result<()> {
    run.sets().create(&PostParams::default(), set).await?;
    Ok(())
}

async fn patch_spec(run: &Run, spec: Value) -> anyhow::Result<()> {
    run.sets()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await?;
    Ok(())
}

/// The set's status has settled on `generation` with `n` replicas all ready and updated.
fn settled(s: &State, generation: i64, n: i32) -> bool {
    let Some(set) = s.sets.get("web") else {
        return false;
    };
    let st = s.status("web");
    set.metadata.generation == Some(generation)
        && st.observed_generation == Some(generation)
        && st.replicas == n
        && st.ready_replicas.unwrap_or(0) == n
        && st.available_replicas.unwrap_or(0) == n
        && st.updated_replicas.unwrap_or(0) == n
        && st.current_revision.is_some()
        && st.current_revision == st.update_revision
        && s.pods.len() == n as usize
        && s.pods.values().all(|p| {
            ready(p)
                && p.metadata.deletion_timestamp.is_none()
                && p.labels().get("controller-revision-hash") == st.update_revision.as_ref()
        })
}

fn status_record(s: &State) -> Value {
    let st = s.status("web");
    let n = |v: Option<i32>| v.unwrap_or(0);
    json!({
        "replicas": st.replicas,
        "readyReplicas": n(st.ready_replicas),
        "availableReplicas": n(st.available_replicas),
        "currentReplicas": n(st.current_replicas),
        "updatedReplicas": n(st.updated_replicas),
        "currentRevision": st.current_revision,
        "updateRevision": st.update_revision,
        "collisionCount": st.collision_count,
        "observedGeneration": st.observed_generation,
        "conditions": st.conditions.iter().flatten().map(|c| c.type_.clone()).collect::<Vec<_>>(),
    })
}

fn owners<K: kube::Resource>(o: &K) -> Vec<String> {
    o.meta()
        .owner_references
        .iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{} controller={:?} block={:?}",
                r.kind, r.name, r.controller, r.block_owner_deletion
            )
        })
        .collect()
}

/// A Pod's identity as the controller built it.
fn pod_record(p: &Pod) -> Value {
    let spec = p.spec.clone().unwrap_or_default();
    let volumes: Vec<_> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| format!("{}={} readOnly={:?}", v.name, c.claim_name, c.read_only))
        })
        .collect();
    let mut labels = p.labels().clone();
    // The hash is recorded with the revisions; here only that it names one.
    if let Some(h) = labels.get_mut("controller-revision-hash") {
        *h = if h.starts_with("web-") {
            "web-<hash>".into()
        } else {
            h.clone()
        };
    }
    json!({
        "labels": labels,
        "annotations": p.annotations(),
        "generateName": p.metadata.generate_name,
        "hostname": spec.hostname,
        "subdomain": spec.subdomain,
        "claims": volumes,
        "owners": owners(p),
        "finalizers": p.finalizers(),
    })
}

fn claim_record(c: &PersistentVolumeClaim) -> Value {
    json!({
        "deleting": c.metadata.deletion_timestamp.is_some(),
        "labels": c.labels(),
        "owners": owners(c),
        "accessModes": c.spec.as_ref().and_then(|s| s.access_modes.clone()),
    })
}

/// Claims not being deleted (a deleted claim stays, held by the API server's pvc-protection
/// finalizer, since no pvc-protection controller runs).
fn live_claims(s: &State) -> usize {
    s.claims
        .values()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .count()
}

/// Event reasons per object, without failures and Pod updates: a claim's owner references may
/// be set while its Pod is Pending (no event) or once it runs (a Pod update, SuccessfulUpdate),
/// and the write may meet a stale cache (a conflict, FailedUpdate); which happens depends on
/// when kwok starts the Pod, for either controller.
fn events(s: &State) -> BTreeMap<String, Vec<String>> {
    s.events
        .iter()
        .map(|(o, r)| {
            let kept = r
                .iter()
                .filter(|r| !r.starts_with("Failed") && *r != "SuccessfulUpdate")
                .cloned();
            (o.clone(), kept.collect())
        })
        .collect()
}

/// The set's creations and deletions have been reported (Events are written asynchronously).
fn reported(s: &State) -> bool {
    s.events.get("StatefulSet/web").is_some_and(|r| {
        r.iter().any(|r| r == "SuccessfulCreate") && r.iter().any(|r| r == "SuccessfulDelete")
    })
}

fn claims(s: &State) -> BTreeMap<String, Value> {
    s.claims
        .iter()
        .map(|(n, c)| (n.clone(), claim_record(c)))
        .collect()
}

fn revisions(s: &State) -> Value {
    s.revisions
        .values()
        .map(|r| {
            json!({
                "name": r.name_any(),
                "revision": r.revision,
                "labels": r.labels(),
                "owners": owners(r),
                "data": r.data,
            })
        })
        .collect()
}

/// Names of the Pods that started terminating after log position `from`, in order.
fn terminated_since(s: &State, from: usize) -> Vec<String> {
    s.log[from..]
        .iter()
        .filter_map(|e| match e {
            Seen::Terminating(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// Position of `ev` at or after `from`.
fn pos_since(s: &State, from: usize, ev: &Seen) -> Option<usize> {
    s.log[from..].iter().position(|e| e == ev).map(|i| i + from)
}

/// OrderedReady: web-0, web-1, web-2 come up one after the other, each only once the previous
/// is Ready, each after its claim; scaling to 1 removes web-2 then web-1, the second only once
/// the first is gone; the claims stay through the scale-down and the set's deletion (Retain).
pub async fn ordered(run: &Run) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    create(run, &web(3, json!({}))).await?;
    let s = run
        .wait_for("3 Ready replicas", |s| settled(s, 1, 3).then(|| s.clone()))
        .await?;
    let created: Vec<_> = s
        .log
        .iter()
        .filter_map(|e| match e {
            Seen::Created(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    for i in 0..2 {
        let (prev, next) = (format!("web-{i}"), format!("web-{}", i + 1));
        match (
            s.position(&Seen::Ready(prev.clone())),
            s.position(&Seen::Created(next.clone())),
        ) {
            (Some(r), Some(c)) if r < c => {}
            (r, c) => problems.push(format!(
                "STS-5 {next} was created (log position {c:?}) before {prev} was Ready ({r:?}): {:?}",
                s.log
            )),
        }
    }
    for i in 0..3 {
        let (pod, claim) = (format!("web-{i}"), format!("www-web-{i}"));
        match (s.claims.get(&claim), s.created_rv.get(&pod)) {
            (Some(c), Some(p)) if rv(c) < *p => {}
            (c, p) => problems.push(format!(
                "STS-2 claim {claim} (resourceVersion {:?}) was not created before {pod} ({p:?})",
                c.map(rv)
            )),
        }
    }
    let pods: BTreeMap<_, _> = s
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), pod_record(p)))
        .collect();
    let up_status = status_record(&s);
    let up_revisions = revisions(&s);

    let mark = s.log.len();
    patch_spec(run, json!({"replicas": 1})).await?;
    let s = run
        .wait_for("a scale-down to web-0", |s| {
            settled(s, 2, 1).then(|| s.clone())
        })
        .await?;
    let terminated = terminated_since(&s, mark);
    if terminated != ["web-2", "web-1"] {
        problems.push(format!(
            "STS-8 scale-down order {terminated:?}, want web-2 then web-1"
        ));
    }
    match (
        pos_since(&s, mark, &Seen::Deleted("web-2".into())),
        pos_since(&s, mark, &Seen::Terminating("web-1".into())),
    ) {
        (Some(gone), Some(next)) if gone < next => {}
        (g, n) => problems.push(format!(
            "STS-8 web-1 was deleted (position {n:?}) before web-2 was gone ({g:?})"
        )),
    }
    let claims_after_scale = claims(&s);
    if claims_after_scale.len() != 3 {
        problems.push(format!(
            "STS-11 claims after the scale-down: {:?}",
            claims_after_scale.keys()
        ));
    }
    let down_status = status_record(&s);

    run.sets()
        .delete("web", &DeleteParams::background())
        .await?;
    let s = run
        .wait_for("the set and its Pods gone", |s| {
            (s.sets.is_empty() && s.pods.is_empty() && reported(s)).then(|| s.clone())
        })
        .await?;
    let claims_after_delete = claims(&s);
    if claims_after_delete.len() != 3 {
        problems.push(format!(
            "STS-11 claims after deleting the set: {:?}, want all three kept",
            claims_after_delete.keys()
        ));
    }
    Ok(Outcome {
        record: json!({
            "created": created,
            "pods": pods,
            "status": up_status,
            "revisions": up_revisions,
            "scaleDownOrder": terminated,
            "statusAfterScaleDown": down_status,
            "claimsAfterScaleDown": claims_after_scale,
            "claimsAfterDelete": claims_after_delete,
            "events": events(&s),
        }),
        problems,
    })
}

/// RollingUpdate with partition 2: a template change replaces only web-2; lowering the partition
/// to 0 then replaces web-1 and web-0, in that order, each once the one before is Ready again.
pub async fn partition(run: &Run) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    let strategy =
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
    create(run, &web(3, strategy)).await?;
    let s = run
        .wait_for("3 Ready replicas", |s| settled(s, 1, 3).then(|| s.clone()))
        .await?;
    let before: BTreeMap<String, String> = s
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), p.uid().unwrap_or_default()))
        .collect();
    let old_revision = s.status("web").current_revision.unwrap_or_default();

    let mark = s.log.len();
    patch_spec(
        run,
        json!({"template": {"spec": {"containers": [{"name": "nginx", "image": "registry.k8s.io/nginx:2"}]}}}),
    )
    .await?;
    let s = run
        .wait_for("web-2 updated and Ready", |s| {
            let st = s.status("web");
            let done = st.observed_generation == Some(2)
                && st.updated_replicas == Some(1)
                && st.ready_replicas == Some(3)
                && st.update_revision != st.current_revision
                && s.pods.get("web-2").is_some_and(|p| {
                    ready(p)
                        && p.metadata.deletion_timestamp.is_none()
                        && p.labels().get("controller-revision-hash") == st.update_revision.as_ref()
                });
            done.then(|| s.clone())
        })
        .await?;
    let partitioned_status = status_record(&s);
    for name in ["web-0", "web-1"] {
        let p = &s.pods[name];
        if p.uid().as_ref() != before.get(name)
            || p.labels().get("controller-revision-hash") != Some(&old_revision)
        {
            problems.push(format!("STS-9 {name} below the partition was replaced"));
        }
    }
    if s.pods["web-2"].uid().as_ref() == before.get("web-2") {
        problems.push("STS-9 web-2 was not replaced".into());
    }
    let first_wave = terminated_since(&s, mark);
    if first_wave != ["web-2"] {
        problems.push(format!(
            "STS-9 the first wave replaced {first_wave:?}, want web-2 once; pod log {:?}; \
             controller log:\n{}",
            s.log,
            run.cluster.manager_log_about(&run.ns)
        ));
    }

    let mark = s.log.len();
    patch_spec(
        run,
        json!({"updateStrategy": {"rollingUpdate": {"partition": 0}}}),
    )
    .await?;
    let s = run
        .wait_for("all replicas updated", |s| {
            (settled(s, 3, 3) && reported(s)).then(|| s.clone())
        })
        .await?;
    let second_wave = terminated_since(&s, mark);
    if second_wave != ["web-1", "web-0"] {
        problems.push(format!(
            "STS-9 update order {second_wave:?}, want web-1 then web-0"
        ));
    }
    let ready_again = s.log[mark..]
        .iter()
        .rposition(|e| *e == Seen::Ready("web-1".into()))
        .map(|i| i + mark);
    match (
        ready_again,
        pos_since(&s, mark, &Seen::Terminating("web-0".into())),
    ) {
        (Some(r), Some(t)) if r < t => {}
        (r, t) => problems.push(format!(
            "STS-9 web-0 was deleted (position {t:?}) before the new web-1 was Ready ({r:?})"
        )),
    }
    Ok(Outcome {
        record: json!({
            "firstWave": first_wave,
            "statusWithPartition": partitioned_status,
            "secondWave": second_wave,
            "status": status_record(&s),
            "revisions": revisions(&s),
            "pods": s.pods.iter().map(|(n, p)| (n.clone(), pod_record(p))).collect::<BTreeMap<_, _>>(),
            "events": events(&s),
        }),
        problems,
    })
}

/// Parallel with the retention policy Delete/Delete: the claims are owned by the set; scaling to
/// 1 hands web-1's and web-2's claims to their Pods, so they go with them; deleting the set
/// takes web-0's claim too.
pub async fn retention(run: &Run) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    let extra = json!({"podManagementPolicy": "Parallel",
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}});
    create(run, &web(3, extra)).await?;
    let s = run
        .wait_for("3 Ready replicas with set-owned claims", |s| {
            let owned = s.claims.len() == 3
                && s.claims
                    .values()
                    .all(|c| owners(c).iter().any(|o| o.starts_with("StatefulSet/web")));
            (settled(s, 1, 3) && owned).then(|| s.clone())
        })
        .await?;
    let mut created: Vec<_> = s
        .log
        .iter()
        .filter_map(|e| match e {
            Seen::Created(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    created.sort();
    let claims_up = claims(&s);

    patch_spec(run, json!({"replicas": 1})).await?;
    let s = run
        .wait_for("web-0 alone with its claim", |s| {
            (settled(s, 2, 1) && live_claims(s) == 1).then(|| s.clone())
        })
        .await?;
    let claims_down = claims(&s);
    if s.claims
        .get("www-web-0")
        .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
    {
        problems.push(format!(
            "WhenScaled=Delete took web-0's claim: {claims_down:?}"
        ));
    }

    run.sets()
        .delete("web", &DeleteParams::background())
        .await?;
    let s = run
        .wait_for("the set, its Pods and its claims gone", |s| {
            let gone = s.sets.is_empty() && s.pods.is_empty() && live_claims(s) == 0;
            (gone && reported(s)).then(|| s.clone())
        })
        .await?;
    Ok(Outcome {
        record: json!({
            "created": created,
            "claims": claims_up,
            "claimsAfterScaleDown": claims_down,
            "claimsAfterDelete": claims(&s),
            "events": events(&s),
        }),
        problems,
    })
}
