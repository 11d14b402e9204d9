//! The resourceclaim controller end to end against the reference control plane, once with
//! kube-controller-manager's `resourceclaim-controller` (`upstream_*`) and once with kpr's
//! (`kpr_*`); every check is the same for both. No scheduler and no DRA driver run: the test
//! allocates a claim (its status, with the scheduler's finalizer) and binds the Pod itself.
//!
//! - a Pod with a claim from a ResourceClaimTemplate gets it: named `<pod>-<claim>-xxxxx`,
//!   controlled by the Pod (blockOwnerDeletion), with the template's labels, annotations and
//!   spec and the `resource.kubernetes.io/pod-claim-name` annotation; the Pod's
//!   `status.resourceClaimStatuses` records it, written by the field manager
//!   `ResourceClaimController`; a claim the Pod names itself is left to the user;
//! - a Pod whose template does not exist gets the Warning `FailedResourceClaimCreation` naming
//!   the template (exact message, source `resource_claim`) and no claim;
//! - the Pod bound to a node: its allocated claim lists it in `status.reservedFor`;
//! - the Pod failed: the reservation goes, and with it the allocation and the finalizer; the
//!   claim generated for it is deleted; the user's claim stays.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::time::Duration;

use common::cluster::{client_with_namespace, create_in};
use common::events::recorded_by;
use common::{Cluster, Flavour};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NS: &str = "dra";
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
const SOURCE: &str = "resource_claim";

fn devices() -> serde_json::Value {
    json!({"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "example.com"}}]}})
}

async fn scenario(flavour: Flavour) {
    let cluster = Cluster::start_minimal(flavour, "resourceclaim", "resourceclaim-controller");
    let client: Client = client_with_namespace(&cluster, NS).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    create_in::<ResourceClaimTemplate>(
        &client,
        NS,
        json!({"metadata": {"name": "tpl"},
               "spec": {"metadata": {"labels": {"app": "a"}, "annotations": {"note": "n"}},
                        "spec": devices()}}),
    )
    .await;
    create_in::<ResourceClaim>(
        &client,
        NS,
        json!({"metadata": {"name": "shared-claim"}, "spec": devices()}),
    )
    .await;
    let pod_with = |name: &str, template: &str| {
        json!({"metadata": {"name": name},
               "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                        "resourceClaims": [
                            {"name": "gpu", "resourceClaimTemplateName": template},
                            {"name": "shared", "resourceClaimName": "shared-claim"}]}})
    };
    create_in::<Pod>(&client, NS, pod_with("p", "tpl")).await;

    // The template's claim, recorded in the Pod's status.
    let generated = cluster
        .eventually_showing("the Pod's claim recorded", WAIT, POLL, || async {
            let p = pods.get("p").await.unwrap();
            let statuses = p
                .status
                .and_then(|s| s.resource_claim_statuses)
                .unwrap_or_default();
            match &statuses[..] {
                [s] if s.name == "gpu" => s.resource_claim_name.clone().ok_or("no name".into()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert!(generated.starts_with("p-gpu-"), "{flavour:?}: {generated}");
    assert_eq!(
        generated.len(),
        "p-gpu-".len() + 5,
        "{flavour:?}: {generated}"
    );
    let c = claims.get(&generated).await.unwrap();
    let pod_uid = pods.get("p").await.unwrap().metadata.uid.unwrap();
    let owner = &c.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("Pod", "p", pod_uid.as_str(), Some(true), Some(true)),
        "{flavour:?}"
    );
    let ann = c.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("note").map(String::as_str),
        Some("n"),
        "{flavour:?}"
    );
    assert_eq!(
        ann.get("resource.kubernetes.io/pod-claim-name")
            .map(String::as_str),
        Some("gpu"),
        "{flavour:?}"
    );
    assert_eq!(
        c.metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get("app")
            .map(String::as_str),
        Some("a"),
        "{flavour:?}"
    );
    // The template's spec as stored (with the API server's defaults).
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let stored = templates.get("tpl").await.unwrap();
    assert_eq!(c.spec, stored.spec.spec, "{flavour:?}");
    let managers: Vec<String> = pods
        .get("p")
        .await
        .unwrap()
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "ResourceClaimController"),
        "{flavour:?}: {managers:?}"
    );
    assert_eq!(
        claims.list(&Default::default()).await.unwrap().items.len(),
        2,
        "{flavour:?}: exactly one claim made (and the user's)"
    );

    // A template that does not exist: the Event, no claim.
    create_in::<Pod>(&client, NS, pod_with("bad", "missing")).await;
    let want = "PodResourceClaim gpu: resource claim template \"missing\": \
                resourceclaimtemplate.resource.k8s.io \"missing\" not found";
    cluster
        .eventually_showing(
            "the FailedResourceClaimCreation Event",
            WAIT,
            POLL,
            || async {
                let seen = recorded_by(
                    &events,
                    "involvedObject.name=bad,reason=FailedResourceClaimCreation",
                    SOURCE,
                )
                .await;
                let messages: Vec<String> = seen.into_iter().filter_map(|e| e.message).collect();
                if messages.iter().any(|m| m == want) {
                    Ok(())
                } else {
                    Err(format!("{messages:?}"))
                }
            },
        )
        .await;

    // The user's claim allocated (as the scheduler does: its finalizer, then the allocation),
    // then the Pod bound: the claim is reserved for it.
    claims
        .patch(
            "shared-claim",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]}}),
            ),
        )
        .await
        .unwrap();
    let allocation = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "example.com", "pool": "p1", "device": "d1"}]}}}});
    claims
        .patch_status(
            "shared-claim",
            &PatchParams::default(),
            &Patch::Merge(allocation),
        )
        .await
        .unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "namespace": NS},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}});
    let _: serde_json::Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .expect("binding the Pod");
    cluster
        .eventually_showing("the claim reserved for the Pod", WAIT, POLL, || async {
            let c = claims.get("shared-claim").await.unwrap();
            let reserved: Vec<(String, String, String)> = c
                .status
                .and_then(|s| s.reserved_for)
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.resource, r.name, r.uid))
                .collect();
            if reserved == [("pods".to_string(), "p".to_string(), pod_uid.clone())] {
                Ok(())
            } else {
                Err(format!("{reserved:?}"))
            }
        })
        .await;

    // The Pod failed: the reservation, the allocation and the finalizer go; its generated
    // claim is deleted; the user's claim stays.
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
    )
    .await
    .unwrap();
    cluster
        .eventually_showing("the claim released", WAIT, POLL, || async {
            let c = claims.get("shared-claim").await.unwrap();
            let status = c.status.clone().unwrap_or_default();
            let finalizers = c.metadata.finalizers.clone().unwrap_or_default();
            if status.reserved_for.unwrap_or_default().is_empty()
                && status.allocation.is_none()
                && finalizers.is_empty()
            {
                Ok(())
            } else {
                Err(format!("{:?} {finalizers:?}", c.status))
            }
        })
        .await;
    cluster
        .eventually(&format!("{generated} deleted"), WAIT, POLL, || async {
            claims
                .get_opt(&generated)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    assert!(
        claims.get_opt("shared-claim").await.unwrap().is_some(),
        "{flavour:?}"
    );
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_resourceclaim_controller() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_resourceclaim_controller() {
    scenario(Flavour::Kpr).await;
}
