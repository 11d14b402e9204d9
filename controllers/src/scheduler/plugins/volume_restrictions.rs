//! VolumeRestrictions (PreFilter, Filter), the part that needs only the Pod and the node: a Pod
//! may not join a node where another Pod already uses the same GCE persistent disk, AWS EBS
//! volume, ISCSI IQN or RBD image, unless both mount it read-only (EBS: never shared), as
//! upstream v1.34's `volumerestrictions` plugin ("node(s) had no available disk").
//!
//! Not implemented: upstream's ReadWriteOncePod check (a Pod whose PersistentVolumeClaim has the
//! ReadWriteOncePod access mode may not be scheduled while another Pod uses that claim, and a
//! missing claim is UnschedulableAndUnresolvable). It needs the PersistentVolumeClaim objects and
//! the snapshot's claim usage, which this plugin is not given (the framework's
//! [`ClusterObjects`](crate::scheduler::framework::ClusterObjects) carries no claims); Pods with
//! claims are kept away by the runtime's guard for volumes it cannot handle. Accordingly there is
//! no PreFilter `add_pod` / `remove_pod`: the disk conflicts read the node's Pods directly.

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PreFilterPlugin, PreFilterResult, Snapshot, Status,
};

pub const NAME: &str = "VolumeRestrictions";

/// Upstream's ErrReasonDiskConflict.
pub const ERR_REASON_DISK_CONFLICT: &str = "node(s) had no available disk";

/// The plugin; it has no arguments.
#[derive(Debug, Default)]
pub struct VolumeRestrictions;

impl VolumeRestrictions {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        VolumeRestrictions
    }
}

fn pod_volumes(pod: &Pod) -> &[Volume] {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
}

/// Volumes whose sources cannot be shared freely (`needsRestrictionsCheck`).
fn needs_restrictions_check(v: &Volume) -> bool {
    v.gce_persistent_disk.is_some()
        || v.aws_elastic_block_store.is_some()
        || v.rbd.is_some()
        || v.iscsi.is_some()
}

fn have_overlap(a: &[String], b: &[String]) -> bool {
    a.iter().any(|x| b.contains(x))
}

/// Whether `volume` conflicts with any volume of `pod` (`isVolumeConflict`).
fn is_volume_conflict(volume: &Volume, pod: &Pod) -> bool {
    let ro = |r: Option<bool>| r.unwrap_or(false);
    pod_volumes(pod).iter().any(|existing| {
        if let (Some(d), Some(e)) = (&volume.gce_persistent_disk, &existing.gce_persistent_disk) {
            if d.pd_name == e.pd_name && !(ro(d.read_only) && ro(e.read_only)) {
                return true;
            }
        }
        if let (Some(d), Some(e)) = (
            &volume.aws_elastic_block_store,
            &existing.aws_elastic_block_store,
        ) {
            if d.volume_id == e.volume_id {
                return true;
            }
        }
        if let (Some(d), Some(e)) = (&volume.iscsi, &existing.iscsi) {
            if d.iqn == e.iqn && !(ro(d.read_only) && ro(e.read_only)) {
                return true;
            }
        }
        if let (Some(d), Some(e)) = (&volume.rbd, &existing.rbd) {
            if have_overlap(&d.monitors, &e.monitors)
                && d.pool == e.pool
                && d.image == e.image
                && !(ro(d.read_only) && ro(e.read_only))
            {
                return true;
            }
        }
        false
    })
}

/// Whether none of the Pod's restricted volumes conflicts with a Pod on the node
/// (`satisfyVolumeConflicts`).
pub fn satisfies_volume_conflicts(pod: &Pod, node: &NodeInfo) -> bool {
    pod_volumes(pod)
        .iter()
        .filter(|v| needs_restrictions_check(v))
        .all(|v| !node.pods.iter().any(|e| is_volume_conflict(v, &e.pod)))
}

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for VolumeRestrictions {
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        if pod_volumes(pod).iter().any(needs_restrictions_check) {
            (None, Status::success())
        } else {
            (None, Status::skip())
        }
    }
}

impl FilterPlugin for VolumeRestrictions {
    fn filter(&self, _state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        if satisfies_volume_conflicts(pod, node) {
            Status::success()
        } else {
            Status::unschedulable(ERR_REASON_DISK_CONFLICT)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::{json, Value};

    fn with_volumes(name: &str, volumes: Value) -> Pod {
        pod(json!({"metadata": {"name": name, "uid": name}, "spec": {"volumes": volumes}}))
    }

    /// Upstream's four tables (TestGCEDiskConflicts, TestAWSDiskConflicts, TestRBDDiskConflicts,
    /// TestISCSIDiskConflicts): nothing, one state on the node, the same state, a different one;
    /// plus the read-only rules.
    #[test]
    fn filter_per_node() {
        let gce = |pd: &str, ro: bool| json!({"name": "v", "gcePersistentDisk": {"pdName": pd, "fsType": "ext4", "readOnly": ro}});
        let ebs = |id: &str| json!({"name": "v", "awsElasticBlockStore": {"volumeID": id, "readOnly": true}});
        let rbd = |mons: Value, ro: bool| json!({"name": "v", "rbd": {"monitors": mons, "pool": "foo", "image": "bar", "fsType": "ext4", "readOnly": ro}});
        let iscsi = |iqn: &str, ro: bool| json!({"name": "v", "iscsi": {"targetPortal": "127.0.0.1:3260", "iqn": iqn, "lun": 0, "fsType": "ext4", "readOnly": ro}});
        let conflict = || status(Code::Unschedulable, &[ERR_REASON_DISK_CONFLICT]);
        let mut cases: Vec<(String, Value, Vec<Value>, Option<Status>)> = Vec::new();
        for (kind, a, b) in [
            ("GCE", gce("foo", false), gce("bar", false)),
            ("AWS", ebs("foo"), ebs("bar")),
            (
                "RBD",
                rbd(json!(["a", "b"]), false),
                rbd(json!(["c", "d"]), false),
            ),
            (
                "ISCSI",
                iscsi("iqn.2016-12.server:storage.target01", false),
                iscsi("iqn.2017-12.server:storage.target01", false),
            ),
        ] {
            cases.push((format!("{kind}: nothing"), json!([]), vec![], None));
            cases.push((
                format!("{kind}: one state on the node"),
                json!([]),
                vec![json!([a.clone()])],
                None,
            ));
            cases.push((
                format!("{kind}: same state"),
                json!([a.clone()]),
                vec![json!([a.clone()])],
                Some(conflict()),
            ));
            cases.push((
                format!("{kind}: different state"),
                json!([b.clone()]),
                vec![json!([a.clone()])],
                Some(ok()),
            ));
        }
        cases.extend([
            (
                "GCE: both read-only share".to_string(),
                json!([gce("foo", true)]),
                vec![json!([gce("foo", true)])],
                Some(ok()),
            ),
            (
                "GCE: one read-write conflicts".to_string(),
                json!([gce("foo", true)]),
                vec![json!([gce("foo", false)])],
                Some(conflict()),
            ),
            (
                "AWS: read-only does not share".to_string(),
                json!([ebs("foo")]),
                vec![json!([ebs("foo")])],
                Some(conflict()),
            ),
            (
                "RBD: overlapping monitors conflict".to_string(),
                json!([rbd(json!(["b", "x"]), false)]),
                vec![json!([rbd(json!(["a", "b"]), false)])],
                Some(conflict()),
            ),
            (
                "RBD: both read-only share".to_string(),
                json!([rbd(json!(["a"]), true)]),
                vec![json!([rbd(json!(["a"]), true)])],
                Some(ok()),
            ),
            (
                "ISCSI: both read-only share".to_string(),
                json!([iscsi("q", true)]),
                vec![json!([iscsi("q", true)])],
                Some(ok()),
            ),
            (
                "a conflict with the second Pod on the node".to_string(),
                json!([gce("foo", false)]),
                vec![json!([gce("bar", false)]), json!([gce("foo", false)])],
                Some(conflict()),
            ),
            (
                "other volume kinds need no check".to_string(),
                json!([{"name": "e", "emptyDir": {}}]),
                vec![json!([{"name": "e", "emptyDir": {}}])],
                None,
            ),
        ]);
        for (name, volumes, existing, want) in cases {
            let p = with_volumes("p", volumes);
            let existing: Vec<Pod> = existing
                .into_iter()
                .enumerate()
                .map(|(i, v)| with_volumes(&format!("e{i}"), v))
                .collect();
            let snap = snapshot(vec![node_info(node("n", json!({})), existing)]);
            let (_, pre) = VolumeRestrictions.pre_filter(&mut CycleState::new(), &p, &snap);
            match want {
                None => assert!(pre.is_skip(), "{name}: PreFilter {pre}"),
                Some(want) => {
                    assert!(pre.is_success(), "{name}: PreFilter {pre}");
                    let got = run_filter(Some(&VolumeRestrictions), &VolumeRestrictions, &p, &snap);
                    assert_eq!(got, vec![want], "{name}");
                }
            }
        }
    }
}
