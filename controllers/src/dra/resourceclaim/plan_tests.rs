//! The resourceclaim decisions over hand-made Pods and claims.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use serde_json::json;

use super::plan::*;
use crate::runtime::cached_pod::CachedPod;

fn pod(extra: serde_json::Value) -> CachedPod {
    let mut v = json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {"resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": "tpl"},
            {"name": "shared", "resourceClaimName": "shared-claim"}
        ]}
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn claim(name: &str, extra: serde_json::Value) -> Arc<ResourceClaim> {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {}});
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn owned(name: &str, pod_claim: &str) -> Arc<ResourceClaim> {
    claim(
        name,
        json!({"metadata": {
            "annotations": {ANN_POD_CLAIM_NAME: pod_claim},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                 "uid": "pod-uid", "controller": true}]}}),
    )
}

const ALLOCATED: &str = r#"{"devices": {"results": []}}"#;

#[test]
fn a_pod_claims_name_comes_from_its_spec_or_its_status() {
    let p = pod(json!({}));
    let claims = pod_claims(&p);
    assert_eq!(claim_name(&p, &claims[0]), ClaimName::NotCreated);
    assert_eq!(
        claim_name(&p, &claims[1]),
        ClaimName::Named {
            name: "shared-claim".into(),
            check_owner: false
        }
    );
    let p = pod(json!({"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "p-gpu-abcde"}]}}));
    assert_eq!(
        claim_name(&p, &pod_claims(&p)[0]),
        ClaimName::Named {
            name: "p-gpu-abcde".into(),
            check_owner: true
        }
    );
    let p = pod(json!({"status": {"resourceClaimStatuses": [{"name": "gpu"}]}}));
    assert_eq!(claim_name(&p, &pod_claims(&p)[0]), ClaimName::NotNeeded);
}

#[test]
fn a_template_claim_is_made_once_and_an_orphan_is_recorded() {
    let p = pod(json!({}));
    let pc = &pod_claims(&p)[0];
    let none = |_: &str| None;
    assert_eq!(
        claim_step(&p, pc, &none, &[]),
        ClaimStep::Create {
            template: "tpl".into()
        }
    );
    // Made before the status was written: found by owner and annotation, not made again.
    let orphan = owned("p-gpu-xyz12", "gpu");
    assert_eq!(
        claim_step(&p, pc, &none, &[owned("p-other-1", "other"), orphan]),
        ClaimStep::Record {
            claim: "p-gpu-xyz12".into()
        }
    );
    // Recorded and there: ready. Recorded but another Pod's: made anew.
    let p = pod(json!({"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "p-gpu-abcde"}]}}));
    let pc = &pod_claims(&p)[0];
    let mine = |_: &str| Some(owned("p-gpu-abcde", "gpu"));
    assert_eq!(claim_step(&p, pc, &mine, &[]), ClaimStep::Ready);
    let foreign = |n: &str| Some(claim(n, json!({})));
    assert_eq!(
        claim_step(&p, pc, &foreign, &[]),
        ClaimStep::Create {
            template: "tpl".into()
        }
    );
    // A user's claim is never made here.
    assert_eq!(
        claim_step(&p, &pod_claims(&p)[1], &none, &[]),
        ClaimStep::Ready
    );
}

#[test]
fn the_generated_claim_follows_the_template_and_names_both() {
    let p = pod(json!({}));
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "tpl", "namespace": "ns"},
        "spec": {"metadata": {"labels": {"app": "a"}, "annotations": {"note": "n"}},
                 "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}}
    }))
    .unwrap();
    let c = claim_from_template(&p, &pod_claims(&p)[0], &t);
    assert_eq!(c.metadata.generate_name.as_deref(), Some("p-gpu-"));
    let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", "pod-uid")
    );
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    let ann = c.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["note"], "n");
    assert_eq!(ann[ANN_POD_CLAIM_NAME], "gpu");
    assert_eq!(c.metadata.labels.as_ref().unwrap()["app"], "a");
    assert_eq!(c.spec, t.spec.spec);
    // Past 57 characters both names shrink in proportion.
    let long = pod(json!({"metadata": {"name": "p".repeat(50)},
        "spec": {"resourceClaims": [{"name": "c".repeat(30), "resourceClaimTemplateName": "tpl"}]}}));
    let c = claim_from_template(&long, &pod_claims(&long)[0], &t);
    let g = c.metadata.generate_name.unwrap();
    // 82 characters: 50*57/82 = 34 of the Pod's, 30*57/82 = 20 of the claim's.
    assert_eq!(g, format!("{}-{}", "p".repeat(34), "c".repeat(20)));
}

#[test]
fn a_scheduled_pod_reserves_its_allocated_claims() {
    let p = pod(
        json!({"spec": {"nodeName": "n"}, "status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "p-gpu-abcde"}]}}),
    );
    let alloc: serde_json::Value = serde_json::from_str(ALLOCATED).unwrap();
    let lookup = |n: &str| {
        Some(if n == "shared-claim" {
            claim(n, json!({"status": {"allocation": alloc}}))
        } else {
            let c = owned(n, "gpu");
            let mut c = (*c).clone();
            c.status = serde_json::from_value(json!({"allocation": alloc,
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}))
            .unwrap();
            Arc::new(c)
        })
    };
    let r = to_reserve(&p, &lookup).unwrap();
    assert_eq!(
        r.iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["shared-claim"],
        "the generated one is reserved already"
    );
    let foreign = |n: &str| Some(claim(n, json!({"status": {"allocation": alloc}})));
    assert!(to_reserve(&p, &foreign)
        .unwrap_err()
        .contains("was not created for pod ns/p (pod is not owner)"));
}

#[test]
fn stale_reservations_go_and_the_last_one_releases_the_allocation() {
    let alloc: serde_json::Value = serde_json::from_str(ALLOCATED).unwrap();
    let c = claim(
        "c",
        json!({"metadata": {"finalizers": [FINALIZER]},
               "status": {"allocation": alloc, "reservedFor": [
                   {"resource": "pods", "name": "a", "uid": "ua"},
                   {"resource": "pods", "name": "b", "uid": "ub"}]}}),
    );
    let only_a = |_: &str, uid: &str| {
        if uid == "ua" {
            Consumer::Running
        } else {
            Consumer::Gone
        }
    };
    let p = claim_plan(&c, &only_a, None).unwrap();
    assert_eq!(p.reserved_for.as_ref().unwrap().len(), 1);
    assert!(!p.deallocate && !p.remove_finalizer && !p.delete);
    let none = |_: &str, _: &str| Consumer::Gone;
    let p = claim_plan(&c, &none, None).unwrap();
    assert_eq!(p.reserved_for, Some(vec![]));
    assert!(p.deallocate && p.remove_finalizer && !p.delete);
    // Everyone still there: nothing.
    let all = |_: &str, _: &str| Consumer::Running;
    assert_eq!(claim_plan(&c, &all, None).unwrap(), ClaimPlan::default());
    // A deleted claim nobody uses loses its finalizer (and its allocation).
    let deleting = claim(
        "c",
        json!({"metadata": {"finalizers": [FINALIZER], "deletionTimestamp": "2026-01-01T00:00:00Z"},
               "status": {"allocation": alloc}}),
    );
    let p = claim_plan(&deleting, &all, None).unwrap();
    assert!(p.deallocate && p.remove_finalizer);
    // A generated claim of a finished Pod goes; of a running or unknown Pod it stays.
    let generated = owned("g", "gpu");
    assert!(
        claim_plan(&generated, &all, Some(Some(true)))
            .unwrap()
            .delete
    );
    assert!(
        !claim_plan(&generated, &all, Some(Some(false)))
            .unwrap()
            .delete
    );
    assert!(!claim_plan(&generated, &all, Some(None)).unwrap().delete);
    // Not a Pod: refused, naming the entry.
    let odd = claim(
        "c",
        json!({"status": {"reservedFor": [{"apiGroup": "apps", "resource": "deployments", "name": "d", "uid": "u"}]}}),
    );
    assert!(claim_plan(&odd, &all, None)
        .unwrap_err()
        .starts_with("unsupported ReservedFor entry"));
}

#[test]
fn a_pod_is_done_when_terminal_or_deleted_unscheduled() {
    assert!(is_pod_done(&pod(json!({"status": {"phase": "Succeeded"}}))));
    assert!(is_pod_done(&pod(
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    )));
    assert!(!is_pod_done(&pod(json!({
        "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n"}
    }))));
    assert!(!is_pod_done(&pod(json!({"status": {"phase": "Running"}}))));
}
