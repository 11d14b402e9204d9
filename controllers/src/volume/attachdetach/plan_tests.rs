//! The attach/detach decisions over hand-made cluster states.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::json;

use super::plan::*;
use crate::runtime::cached_pod::CachedPod;

struct World {
    claims: BTreeMap<String, Arc<PersistentVolumeClaim>>,
    volumes: BTreeMap<String, Arc<PersistentVolume>>,
    no_attach: BTreeSet<String>,
}

impl Lookup for World {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(&format!("{namespace}/{name}")).cloned()
    }
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(name).cloned()
    }
    fn attach_required(&self, driver: &str) -> bool {
        !self.no_attach.contains(driver)
    }
}

fn world() -> World {
    let mut w = World {
        claims: BTreeMap::new(),
        volumes: BTreeMap::new(),
        no_attach: ["nfs.example.com".to_string()].into(),
    };
    for (claim, pv, driver, mode) in [
        ("data", "pv-data", "disk.example.com", "ReadWriteOnce"),
        ("shared", "pv-shared", "disk.example.com", "ReadWriteMany"),
        ("files", "pv-files", "nfs.example.com", "ReadWriteOnce"),
    ] {
        w.claims.insert(
            format!("ns/{claim}"),
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": claim, "namespace": "ns", "uid": format!("uid-{claim}")},
                    "spec": {"volumeName": pv},
                    "status": {"phase": "Bound"}
                }))
                .unwrap(),
            ),
        );
        w.volumes.insert(
            pv.to_string(),
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": pv},
                    "spec": {"accessModes": [mode],
                             "claimRef": {"namespace": "ns", "name": claim, "uid": format!("uid-{claim}")},
                             "csi": {"driver": driver, "volumeHandle": format!("h-{pv}")}}
                }))
                .unwrap(),
            ),
        );
    }
    w.volumes.insert(
        "pv-host".into(),
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "pv-host"},
                "spec": {"hostPath": {"path": "/x"}, "claimRef": {"uid": "uid-host"}}}))
            .unwrap(),
        ),
    );
    w.claims.insert(
        "ns/host".into(),
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": "host", "namespace": "ns", "uid": "uid-host"},
                "spec": {"volumeName": "pv-host"}, "status": {"phase": "Bound"}}),
            )
            .unwrap(),
        ),
    );
    w
}

fn pod(name: &str, claims: &[&str], extra: serde_json::Value) -> Arc<CachedPod> {
    let volumes: Vec<_> = claims
        .iter()
        .map(|c| json!({"name": format!("v-{c}"), "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "n1", "volumes": volumes},
        "status": {"phase": "Running"}
    });
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn attachment(
    name: &str,
    node: &str,
    pv: &str,
    status: serde_json::Value,
) -> Arc<VolumeAttachment> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": "va-uid"},
            "spec": {"attacher": "disk.example.com", "nodeName": node,
                     "source": {"persistentVolumeName": pv}},
            "status": status
        }))
        .unwrap(),
    )
}

fn managed() -> NodeState {
    NodeState {
        exists: true,
        managed: true,
        ..Default::default()
    }
}

fn none(_: &str) -> Option<Vec<PodUse>> {
    None
}

fn zero(_: &str) -> Duration {
    Duration::ZERO
}

#[test]
fn the_attachment_name_is_the_csi_attachers() {
    // The CSI attacher's getAttachmentName: SHA-256 of handle, driver and node concatenated.
    let name = attachment_name("h-pv-data", "disk.example.com", "n1");
    assert_eq!(name.len(), 4 + 64);
    assert!(name.starts_with("csi-"));
    assert_ne!(name, attachment_name("h-pv-data", "disk.example.com", "n2"));
    // `echo -n vol-1ebs.csi.aws.comnode-a | sha256sum`
    assert_eq!(
        attachment_name("vol-1", "ebs.csi.aws.com", "node-a"),
        "csi-7ba6b8ed285c3c863d675c3b4567d68ede4307ae1a37202e02bf2c4b9f42f28b"
    );
    assert_eq!(
        unique_volume_name("disk.example.com", "h-pv-data"),
        "kubernetes.io/csi/disk.example.com^h-pv-data"
    );
    let in_use: BTreeSet<String> = [
        unique_volume_name("disk.example.com", "h-pv-data"),
        "kubernetes.io/host-path/x".to_string(),
    ]
    .into();
    assert_eq!(attachment_names("n1", &in_use), [name].into());
}

#[test]
fn only_attachable_csi_volumes_of_running_pods_are_wanted() {
    let w = world();
    let pods = vec![
        pod("a", &["data", "files", "host"], json!({})),
        pod("b", &["data", "shared"], json!({})),
        pod(
            "done",
            &["shared"],
            json!({"status": {"phase": "Succeeded"}}),
        ),
    ];
    let d = desired(&pods, &w, &BTreeMap::new());
    assert_eq!(
        d.volumes.keys().collect::<Vec<_>>(),
        ["pv-data", "pv-shared"],
        "nfs (attachRequired false) and hostPath are not attached; a finished Pod counts for nothing"
    );
    let users: Vec<_> = d.volumes["pv-data"]
        .pods
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(users, ["a", "b"]);
    assert!(!d.volumes["pv-data"].multi_attach);
    assert!(d.volumes["pv-shared"].multi_attach);
    assert!(d.waiting.is_empty());
}

#[test]
fn a_deleted_pod_counts_until_its_containers_stop() {
    let w = world();
    let running = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]}});
    let stopped = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 0}}}]}});
    let d = desired(&[pod("a", &["data"], running)], &w, &BTreeMap::new());
    assert!(d.volumes.contains_key("pv-data"));
    let d = desired(&[pod("a", &["data"], stopped)], &w, &BTreeMap::new());
    assert!(d.volumes.is_empty());
}

#[test]
fn an_unresolvable_claim_waits_and_keeps_what_it_resolved_to() {
    let mut w = world();
    let pods = vec![pod("a", &["data", "later"], json!({}))];
    let first = desired(&pods, &w, &BTreeMap::new());
    assert_eq!(
        first.waiting,
        [Waiting::Claim("ns/later".into())].into(),
        "a missing claim is waited for"
    );
    // The claim of a volume already resolved leaves the cache for a moment: the volume stays.
    w.claims.remove("ns/data");
    let again = desired(&pods, &w, &first.resolved);
    assert!(again.volumes.contains_key("pv-data"));
    assert!(again.waiting.contains(&Waiting::Claim("ns/data".into())));
    // An unbound claim and a missing volume are waited for too.
    let mut w = world();
    w.claims.insert(
        "ns/data".into(),
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "ns"},
                "spec": {}, "status": {"phase": "Pending"}}))
            .unwrap(),
        ),
    );
    w.volumes.remove("pv-shared");
    let d = desired(
        &[pod("b", &["data", "shared"], json!({}))],
        &w,
        &BTreeMap::new(),
    );
    assert!(d.volumes.is_empty());
    assert_eq!(
        d.waiting,
        [
            Waiting::Claim("ns/data".into()),
            Waiting::Volume("pv-shared".into())
        ]
        .into()
    );
}

#[test]
fn a_wanted_volume_is_attached_then_reported_with_an_event() {
    let w = world();
    let d = desired(&[pod("a", &["data"], json!({}))], &w, &BTreeMap::new());
    let name = attachment_name("h-pv-data", "disk.example.com", "n1");
    let p = plan("n1", &managed(), &d.volumes, &[], &none, &zero);
    assert_eq!(
        p.create,
        [(name.clone(), "disk.example.com".into(), "pv-data".into())]
    );
    assert!(p.report.is_none(), "nothing attached, nothing reported");
    // Created, not attached yet: nothing to do.
    let pending = attachment(&name, "n1", "pv-data", json!({"attached": false}));
    let p = plan("n1", &managed(), &d.volumes, &[pending], &none, &zero);
    assert!(p.create.is_empty() && p.detach.is_empty() && p.report.is_none());
    // The attacher failed: the Pods hear it.
    let failed = attachment(
        &name,
        "n1",
        "pv-data",
        json!({"attached": false, "attachError": {"message": "rpc error: no disk"}}),
    );
    let p = plan("n1", &managed(), &d.volumes, &[failed], &none, &zero);
    assert_eq!(p.events.len(), 1);
    assert_eq!(p.events[0].reason, "FailedAttachVolume");
    assert_eq!(
        p.events[0].message,
        "AttachVolume.Attach failed for volume \"pv-data\" : rpc error: no disk"
    );
    // Attached: the node reports it, and the Pods hear it once.
    let done = attachment(&name, "n1", "pv-data", json!({"attached": true}));
    let p = plan(
        "n1",
        &managed(),
        &d.volumes,
        std::slice::from_ref(&done),
        &none,
        &zero,
    );
    let report = p.report.expect("a new report");
    assert_eq!(report.len(), 1);
    assert_eq!(
        report[0].name,
        "kubernetes.io/csi/disk.example.com^h-pv-data"
    );
    assert_eq!(p.events[0].reason, "SuccessfulAttachVolume");
    let mut reported = managed();
    reported.reported = [report[0].name.clone()].into();
    let p = plan("n1", &reported, &d.volumes, &[done], &none, &zero);
    assert!(p.report.is_none() && p.events.is_empty());
}

#[test]
fn an_exclusive_volume_waits_for_the_other_node() {
    let w = world();
    let d = desired(
        &[pod("a", &["data", "shared"], json!({}))],
        &w,
        &BTreeMap::new(),
    );
    let user = |ns: &str, name: &str| PodUse {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    };
    let holders = vec![user("ns", "z"), user("ns", "y"), user("other", "x")];
    let elsewhere = |pv: &str| (pv == "pv-data" || pv == "pv-shared").then(|| holders.clone());
    let p = plan("n1", &managed(), &d.volumes, &[], &elsewhere, &zero);
    assert_eq!(
        p.create.len(),
        1,
        "ReadWriteMany attaches beside the other node"
    );
    assert_eq!(p.create[0].2, "pv-shared");
    assert_eq!(p.blocked, ["pv-data".to_string()].into());
    assert_eq!(p.events.len(), 1);
    assert_eq!(
        p.events[0].message,
        "Multi-Attach error for volume \"pv-data\" Volume is already used by pod(s) y, z and 1 \
         pod(s) in different namespaces"
    );
    // Attached elsewhere with no Pod left there: the plain message.
    let gone = |_: &str| Some(Vec::new());
    let p = plan("n1", &managed(), &d.volumes, &[], &gone, &zero);
    assert_eq!(
        p.events[0].message,
        "Multi-Attach error for volume \"pv-data\" Volume is already exclusively attached to one \
         node and can't be attached to another"
    );
}

#[test]
fn an_unwanted_volume_is_unreported_then_detached_once_unmounted() {
    let name = attachment_name("h-pv-data", "disk.example.com", "n1");
    let unique = unique_volume_name("disk.example.com", "h-pv-data");
    let done = attachment(&name, "n1", "pv-data", json!({"attached": true}));
    let mut node = managed();
    node.reported = [unique.clone()].into();
    node.in_use = [unique.clone()].into();
    let nothing = BTreeMap::new();
    // The plan for a node whose one attachment (`done`) nobody wants, waited for `waited`.
    let unplanned = |node: &NodeState, waited: Duration| {
        plan(
            "n1",
            node,
            &nothing,
            std::slice::from_ref(&done),
            &none,
            &|_| waited,
        )
    };
    // Still mounted: still reported, detached when kubelet lets go or after six minutes.
    let p = plan(
        "n1",
        &node,
        &nothing,
        std::slice::from_ref(&done),
        &none,
        &|_| Duration::from_secs(60),
    );
    assert_eq!(p.report, None);
    assert_eq!(
        p.detach,
        [Detach::Wait {
            attachment: name.clone(),
            after: Duration::from_secs(300)
        }]
    );
    let p = plan(
        "n1",
        &node,
        &nothing,
        std::slice::from_ref(&done),
        &none,
        &|_| MAX_WAIT_FOR_UNMOUNT,
    );
    assert_eq!(
        p.detach,
        [Detach::Now {
            attachment: name.clone(),
            forced: true
        }]
    );
    // Unmounted: unreported and detached in the same pass (the report is written first).
    node.in_use.clear();
    let p = unplanned(&node, Duration::ZERO);
    assert_eq!(
        p.detach,
        [Detach::Now {
            attachment: name.clone(),
            forced: false
        }]
    );
    assert_eq!(p.report, Some(vec![]));
    // Made since the node last changed: taken as mounted until the node says otherwise.
    node.reported.clear();
    node.assumed_mounted = [name.clone()].into();
    let p = unplanned(&node, Duration::ZERO);
    assert!(matches!(p.detach[..], [Detach::Wait { .. }]));
    node.assumed_mounted.clear();
    // A deleted node's attachments go; an unmanaged node's are left to its kubelet.
    let p = plan(
        "n1",
        &NodeState::default(),
        &nothing,
        std::slice::from_ref(&done),
        &none,
        &zero,
    );
    assert_eq!(p.detach.len(), 1);
    let unmanaged = NodeState {
        exists: true,
        ..Default::default()
    };
    let p = plan("n1", &unmanaged, &nothing, &[done], &none, &zero);
    assert!(p.detach.is_empty() && p.create.is_empty() && p.report.is_none());
}
