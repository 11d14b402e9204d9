//! The binder's decisions, over cases of upstream's `binder_test.go`, `index_test.go`,
//! `delete_test.go` and `pv_controller_test.go` in this project's words.

use std::sync::Arc;

use serde_json::json;

use super::*;

fn pv(
    name: &str,
    size: &str,
    class: &str,
    modes: &[&str],
    extra: serde_json::Value,
) -> Arc<PersistentVolume> {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": size}, "accessModes": modes, "storageClassName": class,
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/data"}},
        "status": {"phase": "Available"},
    });
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn pvc(
    name: &str,
    size: &str,
    class: &str,
    modes: &[&str],
    extra: serde_json::Value,
) -> PersistentVolumeClaim {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"resources": {"requests": {"storage": size}}, "accessModes": modes,
                 "storageClassName": class},
        "status": {"phase": "Pending"},
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

const RWO: &[&str] = &["ReadWriteOnce"];

fn world<'a>(volumes: &'a [Arc<PersistentVolume>]) -> ClaimWorld<'a> {
    ClaimWorld {
        volumes,
        named_volume: None,
        class: None,
        default_class: None,
        unscheduled_pods: Vec::new(),
    }
}

fn class(name: &str, mode: &str, provisioner: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode,
    }))
    .unwrap()
}

#[test]
fn the_smallest_fitting_volume_of_the_fewest_modes_wins() {
    let vols = vec![
        pv("big", "10Gi", "c", RWO, json!({})),
        pv(
            "rwx",
            "2Gi",
            "c",
            &["ReadWriteOnce", "ReadWriteMany"],
            json!({}),
        ),
        pv("mid", "5Gi", "c", RWO, json!({})),
        pv("small", "1Gi", "c", RWO, json!({})),
        pv("other-class", "3Gi", "d", RWO, json!({})),
        pv(
            "block",
            "3Gi",
            "c",
            RWO,
            json!({"spec": {"volumeMode": "Block"}}),
        ),
        pv(
            "pending",
            "3Gi",
            "c",
            RWO,
            json!({"status": {"phase": "Pending"}}),
        ),
    ];
    let step = |c: &PersistentVolumeClaim| plan_claim(c, &world(&vols));
    // RWO group first: mid (5Gi) over the smaller rwx of a larger mode set.
    assert_eq!(
        step(&pvc("a", "2Gi", "c", RWO, json!({}))),
        ClaimStep::Bind("mid".into())
    );
    assert_eq!(
        step(&pvc("a", "1Gi", "c", RWO, json!({}))),
        ClaimStep::Bind("small".into())
    );
    assert_eq!(
        step(&pvc("a", "1Gi", "c", &["ReadWriteMany"], json!({}))),
        ClaimStep::Bind("rwx".into())
    );
    assert_eq!(
        step(&pvc(
            "a",
            "1Gi",
            "c",
            RWO,
            json!({"spec": {"volumeMode": "Block"}})
        )),
        ClaimStep::Bind("block".into())
    );
    assert_eq!(
        step(&pvc("a", "1Gi", "d", RWO, json!({}))),
        ClaimStep::Bind("other-class".into())
    );
}

#[test]
fn selectors_prebinding_and_deletion_decide_too() {
    let vols = vec![
        pv("small", "1Gi", "c", RWO, json!({})),
        pv(
            "gold",
            "3Gi",
            "c",
            RWO,
            json!({"metadata": {"labels": {"tier": "gold"}}}),
        ),
        pv(
            "mine",
            "8Gi",
            "c",
            RWO,
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "a"}}}),
        ),
        pv(
            "theirs",
            "1Gi",
            "c",
            RWO,
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "b"}}}),
        ),
        pv(
            "going",
            "1Gi",
            "c",
            RWO,
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        ),
    ];
    let w = world(&vols);
    assert_eq!(
        plan_claim(&pvc("a", "1Gi", "c", RWO, json!({})), &w),
        ClaimStep::Bind("mine".into())
    );
    let gold = json!({"spec": {"selector": {"matchLabels": {"tier": "gold"}}}});
    assert_eq!(
        plan_claim(&pvc("x", "1Gi", "c", RWO, gold), &w),
        ClaimStep::Bind("gold".into())
    );
    let platinum = json!({"spec": {"selector": {"matchLabels": {"tier": "platinum"}}}});
    assert_eq!(
        plan_claim(&pvc("x", "1Gi", "", RWO, platinum), &w),
        ClaimStep::Pending(Some(Ev {
            warning: false,
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set"
                .into(),
        }))
    );
}

#[test]
fn delayed_binding_waits_for_the_selected_node_then_hands_over() {
    let vols = vec![pv("v", "1Gi", "wffc", RWO, json!({}))];
    let sc = class("wffc", "WaitForFirstConsumer", "example.com/p");
    let mut w = world(&vols);
    w.class = Some(&sc);
    let claim = pvc("a", "1Gi", "wffc", RWO, json!({}));
    let step = plan_claim(&claim, &w);
    assert_eq!(
        step,
        ClaimStep::Pending(Some(Ev {
            warning: false,
            reason: "WaitForFirstConsumer",
            message: "waiting for first consumer to be created before binding".into(),
        }))
    );
    w.unscheduled_pods = vec!["p1".into(), "p2".into()];
    let ClaimStep::Pending(Some(ev)) = plan_claim(&claim, &w) else {
        panic!()
    };
    assert_eq!(
        (ev.reason, ev.message.as_str()),
        (
            "WaitForPodScheduled",
            "waiting for pods p1,p2 to be scheduled"
        )
    );
    let selected = pvc(
        "a",
        "1Gi",
        "wffc",
        RWO,
        json!({"metadata": {"annotations": {ANN_SELECTED_NODE: "n"}}}),
    );
    // The volume is the scheduler's to bind; the claim goes to the provisioner.
    assert_eq!(
        plan_claim(&selected, &w),
        ClaimStep::ProvisionExternal("example.com/p".into())
    );
}

#[test]
fn provisioning_failures_name_the_class_or_the_plugin() {
    let w = world(&[]);
    let claim = pvc("a", "1Gi", "missing", RWO, json!({}));
    assert_eq!(
        plan_claim(&claim, &w),
        ClaimStep::Event(Ev {
            warning: true,
            reason: "ProvisioningFailed",
            message: "storageclass.storage.k8s.io \"missing\" not found".into(),
        })
    );
    let sc = class("local", "Immediate", "kubernetes.io/no-provisioner");
    let mut w = world(&[]);
    w.class = Some(&sc);
    let ClaimStep::Event(ev) = plan_claim(&pvc("a", "1Gi", "local", RWO, json!({})), &w) else {
        panic!()
    };
    assert_eq!(
        ev.message,
        "no volume plugin matched name: kubernetes.io/no-provisioner"
    );
    let sc = class("ebs", "Immediate", "kubernetes.io/aws-ebs");
    w.class = Some(&sc);
    assert_eq!(
        plan_claim(&pvc("a", "1Gi", "ebs", RWO, json!({})), &w),
        ClaimStep::ProvisionExternal("ebs.csi.aws.com".into())
    );
}

#[test]
fn a_claim_without_a_class_gets_the_newest_default() {
    let classes: Vec<StorageClass> = [
        ("old", "2020-01-01T00:00:00Z"),
        ("new", "2024-01-01T00:00:00Z"),
        ("plain", "2025-01-01T00:00:00Z"),
    ]
    .iter()
    .map(|(n, t)| {
        let default = if *n == "plain" { "false" } else { "true" };
        serde_json::from_value(json!({"metadata": {"name": n, "creationTimestamp": t,
                "annotations": {ANN_DEFAULT_CLASS: default}}, "provisioner": "p"}))
        .unwrap()
    })
    .collect();
    let default = default_class(classes.iter()).map(|c| c.metadata.name.clone().unwrap());
    assert_eq!(default.as_deref(), Some("new"));
    let mut claim = pvc("a", "1Gi", "", RWO, json!({}));
    claim.spec.as_mut().unwrap().storage_class_name = None;
    let mut w = world(&[]);
    w.default_class = default.as_deref();
    assert_eq!(plan_claim(&claim, &w), ClaimStep::AssignClass("new".into()));
}

#[test]
fn a_named_volume_is_bound_checked_or_waited_for() {
    let other = pv("v", "1Gi", "other", RWO, json!({}));
    let claim = pvc("a", "1Gi", "c", RWO, json!({"spec": {"volumeName": "v"}}));
    let mut w = world(&[]);
    assert_eq!(plan_claim(&claim, &w), ClaimStep::Pending(None));
    w.named_volume = Some(&other);
    assert_eq!(
        plan_claim(&claim, &w),
        ClaimStep::Pending(Some(Ev {
            warning: true,
            reason: "VolumeMismatch",
            message: "Cannot bind to requested volume \"v\": storageClassName does not match"
                .into(),
        }))
    );
    let taken = pv(
        "v",
        "1Gi",
        "c",
        RWO,
        json!({"spec": {"claimRef": {"namespace": "ns", "name": "b", "uid": "uid-b"}}}),
    );
    w.named_volume = Some(&taken);
    let ClaimStep::Pending(Some(ev)) = plan_claim(&claim, &w) else {
        panic!()
    };
    assert_eq!(
        ev.message,
        "volume \"v\" already bound to a different claim."
    );
}

#[test]
fn bound_claims_become_lost_once() {
    let claim = pvc(
        "a",
        "1Gi",
        "c",
        RWO,
        json!({"metadata": {"annotations": {ANN_BIND_COMPLETED: "yes"}},
                                                  "spec": {"volumeName": "v"}, "status": {"phase": "Bound"}}),
    );
    let ClaimStep::Lost(ev) = plan_claim(&claim, &world(&[])) else {
        panic!()
    };
    assert_eq!(
        (ev.reason, ev.message.as_str()),
        (
            "ClaimLost",
            "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
        )
    );
    let mut lost = claim.clone();
    lost.status.as_mut().unwrap().phase = Some("Lost".into());
    assert_eq!(plan_claim(&lost, &world(&[])), ClaimStep::Nothing);
    let elsewhere = pv(
        "v",
        "1Gi",
        "c",
        RWO,
        json!({"spec": {"claimRef": {"namespace": "ns", "name": "a", "uid": "other"}}}),
    );
    let mut w = world(&[]);
    w.named_volume = Some(&elsewhere);
    let ClaimStep::Lost(ev) = plan_claim(&claim, &w) else {
        panic!()
    };
    assert_eq!(ev.reason, "ClaimMisbound");
}

#[test]
fn volumes_follow_their_claims() {
    let claim = pvc("a", "1Gi", "c", RWO, json!({"spec": {"volumeName": "v"}}));
    let bound = pv(
        "v",
        "1Gi",
        "c",
        RWO,
        json!({"spec": {"claimRef": {"namespace": "ns", "name": "a", "uid": "uid-a"}}}),
    );
    assert_eq!(
        plan_volume(&bound, Some(&claim)),
        VolumeStep::Phase("Bound")
    );
    assert_eq!(plan_volume(&bound, None), VolumeStep::Release);
    let free = pv(
        "v",
        "1Gi",
        "c",
        RWO,
        json!({"status": {"phase": "Pending"}}),
    );
    assert_eq!(plan_volume(&free, None), VolumeStep::Phase("Available"));
    let unbound_claim = pvc("a", "1Gi", "c", RWO, json!({}));
    assert_eq!(
        plan_volume(&bound, Some(&unbound_claim)),
        VolumeStep::SyncClaim("ns/a".into())
    );
    let elsewhere = pvc("a", "1Gi", "c", RWO, json!({"spec": {"volumeName": "w"}}));
    assert_eq!(plan_volume(&bound, Some(&elsewhere)), VolumeStep::Unbind);
    let provisioned = pv(
        "v",
        "1Gi",
        "c",
        RWO,
        json!({
        "metadata": {"annotations": {ANN_DYNAMICALLY_PROVISIONED: "p"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete",
                 "claimRef": {"namespace": "ns", "name": "a", "uid": "uid-a"}}}),
    );
    assert_eq!(
        plan_volume(&provisioned, Some(&elsewhere)),
        VolumeStep::Release
    );
}

#[test]
fn reclaiming_follows_the_policy_and_the_plugins_kube_controller_manager_has() {
    let with = |extra| pv("v", "1Gi", "c", RWO, extra);
    assert_eq!(reclaim(&with(json!({}))), Reclaim::Keep);
    assert_eq!(
        reclaim(&with(
            json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})
        )),
        Reclaim::Delete
    );
    let Reclaim::Fail(ev) = reclaim(&with(
        json!({"spec": {"persistentVolumeReclaimPolicy": "Recycle", "hostPath": null, "local": {"path": "/x"}}}),
    )) else {
        panic!()
    };
    assert_eq!(
        (ev.reason, ev.message.as_str()),
        (
            "VolumeFailedRecycle",
            "No recycler plugin found for the volume!"
        )
    );

    assert_eq!(deleter(&with(json!({}))), Deleter::HostPath("/data".into()));
    assert_eq!(
        deleter(&with(
            json!({"metadata": {"annotations": {ANN_DYNAMICALLY_PROVISIONED: "rancher.io/local-path"}}})
        )),
        Deleter::External
    );
    assert_eq!(
        deleter(&with(
            json!({"spec": {"hostPath": null, "csi": {"driver": "d", "volumeHandle": "h"}}})
        )),
        Deleter::External
    );
    assert_eq!(
        deleter(&with(json!({"spec": {"hostPath": null, "nfs": {"server": "s", "path": "/"}}}))),
        Deleter::Error("error getting deleter volume plugin for volume \"v\": no deletable volume plugin matched".into())
    );
    assert_eq!(
        deleter(&with(
            json!({"spec": {"hostPath": null, "local": {"path": "/x"}}})
        )),
        Deleter::Error(
            "error getting deleter volume plugin for volume \"v\": no volume plugin matched".into()
        )
    );
    assert!(host_path_deletable("/tmp/x").is_ok());
    assert!(host_path_deletable("/var/tmp/x").is_ok());
    assert_eq!(
        host_path_deletable("/tmp/"),
        Err("host_path deleter only supports /tmp/.+ but received provided /tmp/".into())
    );
    assert!(host_path_deletable("/data/x").is_err());
}
