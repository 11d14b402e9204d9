//! VolumeRestrictions (PreFilter, Filter), as upstream v1.34's `volumerestrictions` plugin:
//!
//! - a Pod may not join a node where another Pod already uses the same GCE persistent disk, AWS
//!   EBS volume, ISCSI IQN or RBD image, unless both mount it read-only (EBS: never shared)
//!   ("node(s) had no available disk");
//! - a Pod whose PersistentVolumeClaim has the ReadWriteOncePod access mode may not be scheduled
//!   while another Pod (on any node) uses that claim ("node has pod using PersistentVolumeClaim
//!   with the same name and ReadWriteOncePod access mode", Unschedulable: preempting the user
//!   helps; PreFilter's `add_pod` / `remove_pod` keep the count for preemption), and a claim
//!   that does not exist is UnschedulableAndUnresolvable already in PreFilter.
//!
//! The disk conflicts read the node's Pods directly.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::scheduler::framework::{
    ClusterObjects, CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin,
    PreFilterResult, Snapshot, StaticObjects, Status,
};

pub const NAME: &str = "VolumeRestrictions";
const STATE_KEY: &str = "PreFilterVolumeRestrictions";

/// Upstream's ErrReasonDiskConflict.
pub const ERR_REASON_DISK_CONFLICT: &str = "node(s) had no available disk";
/// Upstream's ErrReasonReadWriteOncePodConflict.
pub const ERR_REASON_RWOP_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

/// The plugin; it has no arguments.
pub struct VolumeRestrictions {
    objects: Arc<dyn ClusterObjects>,
}

impl Default for VolumeRestrictions {
    fn default() -> Self {
        VolumeRestrictions::new(Arc::new(StaticObjects::default()))
    }
}

/// PreFilter's findings: the Pod's ReadWriteOncePod claims (`namespace/name`) and how many
/// Pods in the snapshot use them.
#[derive(Debug, Clone, Default)]
struct PreFilterState {
    rwop_claims: BTreeSet<String>,
    conflicting: i64,
}

impl VolumeRestrictions {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new(objects: Arc<dyn ClusterObjects>) -> Self {
        VolumeRestrictions { objects }
    }

    /// `readWriteOncePodPVCsForPod`: the Pod's claims (generic ephemeral volumes' excluded, as
    /// upstream) with the ReadWriteOncePod mode; a missing claim is an error.
    fn rwop_claims(&self, pod: &Pod) -> Result<BTreeSet<String>, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut out = BTreeSet::new();
        for v in pod_volumes(pod) {
            let Some(c) = &v.persistent_volume_claim else {
                continue;
            };
            let Some(pvc) = self.objects.persistent_volume_claim(ns, &c.claim_name) else {
                return Err(format!(
                    "persistentvolumeclaim {:?} not found",
                    c.claim_name
                ));
            };
            let rwop = pvc
                .spec
                .iter()
                .flat_map(|s| s.access_modes.iter().flatten())
                .any(|m| m == "ReadWriteOncePod");
            if rwop {
                out.insert(format!("{ns}/{}", c.claim_name));
            }
        }
        Ok(out)
    }
}

/// How many of `claims` the Pod uses (upstream's PVCRefCounts of a node, per Pod).
fn uses(pod: &Pod, claims: &BTreeSet<String>) -> i64 {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    pod_volumes(pod)
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .filter(|c| claims.contains(&format!("{ns}/{}", c.claim_name)))
        .count() as i64
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
        state: &mut CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let needs_check = pod_volumes(pod).iter().any(needs_restrictions_check);
        let rwop_claims = match self.rwop_claims(pod) {
            Ok(c) => c,
            Err(e) => return (None, Status::unresolvable(e)),
        };
        let conflicting = if rwop_claims.is_empty() {
            0
        } else {
            snapshot
                .nodes
                .iter()
                .flat_map(|n| n.pods.iter())
                .map(|p| uses(&p.pod, &rwop_claims))
                .sum()
        };
        if !needs_check && conflicting == 0 {
            return (None, Status::skip());
        }
        state.write(
            STATE_KEY,
            PreFilterState {
                rwop_claims,
                conflicting,
            },
        );
        (None, Status::success())
    }

    fn add_pod(&self, state: &mut CycleState, _pod: &Pod, added: &PodInfo, _: &NodeInfo) -> Status {
        if let Some(s) = state.read_mut::<PreFilterState>(STATE_KEY) {
            s.conflicting += uses(&added.pod, &s.rwop_claims);
        }
        Status::success()
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        _pod: &Pod,
        removed: &PodInfo,
        _: &NodeInfo,
    ) -> Status {
        if let Some(s) = state.read_mut::<PreFilterState>(STATE_KEY) {
            s.conflicting -= uses(&removed.pod, &s.rwop_claims);
        }
        Status::success()
    }
}

impl FilterPlugin for VolumeRestrictions {
    fn filter(&self, state: &CycleState, pod: &Pod, node: &NodeInfo) -> Status {
        if !satisfies_volume_conflicts(pod, node) {
            return Status::unschedulable(ERR_REASON_DISK_CONFLICT);
        }
        if state
            .read::<PreFilterState>(STATE_KEY)
            .is_some_and(|s| s.conflicting > 0)
        {
            return Status::unschedulable(ERR_REASON_RWOP_CONFLICT);
        }
        Status::success()
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
            let pl = VolumeRestrictions::default();
            let (_, pre) = pl.pre_filter(&mut CycleState::new(), &p, &snap);
            match want {
                None => assert!(pre.is_skip(), "{name}: PreFilter {pre}"),
                Some(want) => {
                    assert!(pre.is_success(), "{name}: PreFilter {pre}");
                    let got = run_filter(Some(&pl), &pl, &p, &snap);
                    assert_eq!(got, vec![want], "{name}");
                }
            }
        }
    }

    /// Upstream's ReadWriteOncePod cases: a claim in use by a Pod on any node rejects the Pod on
    /// every node; unused, or without the mode, it does not; a missing claim is unresolvable.
    #[test]
    fn read_write_once_pod_claims() {
        let claim = |name: &str, mode: &str| {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                    "spec": {"accessModes": [mode]}}))
                .unwrap(),
            )
        };
        let pl = VolumeRestrictions::new(Arc::new(StaticObjects {
            persistent_volume_claims: vec![
                claim("rwop", "ReadWriteOncePod"),
                claim("rwo", "ReadWriteOnce"),
            ],
            ..StaticObjects::default()
        }));
        let using = |name: &str, c: &str| {
            let mut p = with_volumes(
                name,
                json!([{"name": "v", "persistentVolumeClaim": {"claimName": c}}]),
            );
            p.metadata.namespace = Some("default".into());
            p
        };
        let conflict = || status(Code::Unschedulable, &[ERR_REASON_RWOP_CONFLICT]);
        let snap = snapshot(vec![
            node_info(
                node("n1", json!({})),
                vec![using("a", "rwop"), using("b", "rwo")],
            ),
            node_info(node("n2", json!({})), vec![]),
        ]);
        let p = using("p", "rwop");
        let (_, pre) = pl.pre_filter(&mut CycleState::new(), &p, &snap);
        assert!(pre.is_success(), "{pre}");
        assert_eq!(
            run_filter(Some(&pl), &pl, &p, &snap),
            vec![conflict(), conflict()]
        );
        let (_, pre) = pl.pre_filter(&mut CycleState::new(), &using("q", "rwo"), &snap);
        assert!(pre.is_skip(), "a ReadWriteOnce claim in use: {pre}");
        let empty = snapshot(vec![node_info(node("n2", json!({})), vec![])]);
        let (_, pre) = pl.pre_filter(&mut CycleState::new(), &p, &empty);
        assert!(pre.is_skip(), "an unused ReadWriteOncePod claim: {pre}");
        let (_, pre) = pl.pre_filter(&mut CycleState::new(), &using("m", "missing"), &snap);
        assert_eq!(
            (pre.code, pre.reasons),
            (
                Code::UnschedulableAndUnresolvable,
                vec!["persistentvolumeclaim \"missing\" not found".to_string()]
            )
        );
    }
}
