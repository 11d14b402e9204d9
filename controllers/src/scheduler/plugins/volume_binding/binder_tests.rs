//! Upstream's volumebinding tables (volume_binding_test.go, binder_test.go) and
//! component-helpers' FindMatchingVolume cases, restated: PreFilter's errors, Filter's reasons per node for bound and WaitForFirstConsumer claims
//! (static matching by class, size, access modes, volume mode, selector and node affinity; the
//! provisioner and allowedTopologies), and Reserve / Unreserve in the assume cache.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use serde_json::{json, Value};

use super::binder::{
    find_matching_volume, ERR_REASON_BIND_CONFLICT, ERR_REASON_NODE_CONFLICT,
    ERR_REASON_PV_NOT_EXIST,
};
use super::*;
use crate::scheduler::framework::{Code, StaticObjects};
use crate::scheduler::plugin_args::decode;

const WFFC: &str = "wait";
const IMMEDIATE: &str = "immediate";
const PROVISIONED: &str = "provisioned";
const TOPOLOGY: &str = "topo";

fn class(
    name: &str,
    mode: &str,
    provisioner: &str,
    topology: Option<Value>,
) -> Arc<k8s_openapi::api::storage::v1::StorageClass> {
    let mut sc =
        json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode});
    if let Some(t) = topology {
        sc["allowedTopologies"] = t;
    }
    Arc::new(serde_json::from_value(sc).unwrap())
}

/// A volume: name, class, size, the hostname it is pinned to (if any), and `extra` merged in.
fn pv(
    name: &str,
    class: &str,
    size: &str,
    host: Option<&str>,
    extra: Value,
) -> Arc<PersistentVolume> {
    let mut v = json!({
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"storageClassName": class, "capacity": {"storage": size},
                 "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Available"}
    });
    if let Some(h) = host {
        v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [h]}]}]}});
    }
    json_patch::merge(&mut v, &extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

/// A claim: name, class, request, and `extra` merged in.
fn pvc(name: &str, class: &str, size: &str, extra: Value) -> Arc<PersistentVolumeClaim> {
    let mut c = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": size}}}
    });
    json_patch::merge(&mut c, &extra);
    Arc::new(serde_json::from_value(c).unwrap())
}

fn bound_to(volume: &str) -> Value {
    json!({"metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
           "spec": {"volumeName": volume}})
}

fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}}}))
    .unwrap()
}

fn pod_with(volumes: Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"containers": [], "volumes": volumes}}),
    )
    .unwrap()
}

fn pod(claims: &[&str]) -> Pod {
    pod_with(json!(claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect::<Vec<_>>()))
}

fn objects(
    pvs: Vec<Arc<PersistentVolume>>,
    pvcs: Vec<Arc<PersistentVolumeClaim>>,
) -> StaticObjects {
    StaticObjects {
        persistent_volumes: pvs,
        persistent_volume_claims: pvcs,
        storage_classes: vec![
            class(
                WFFC,
                "WaitForFirstConsumer",
                "kubernetes.io/no-provisioner",
                None,
            ),
            class(IMMEDIATE, "Immediate", "kubernetes.io/no-provisioner", None),
            class(PROVISIONED, "WaitForFirstConsumer", "csi.example.com", None),
            class(
                TOPOLOGY,
                "WaitForFirstConsumer",
                "csi.example.com",
                Some(json!([
                {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["z1"]}]}])),
            ),
        ],
        ..StaticObjects::default()
    }
}

fn plugin(objects: StaticObjects) -> VolumeBinding {
    VolumeBinding::new(&decode(None, "args").unwrap(), Arc::new(objects), None)
}

/// A status's code and reasons.
type Outcome = (Code, Vec<String>);

/// PreFilter then Filter on each node: PreFilter's code and reasons when it fails, or
/// each node's (code, reasons).
fn run(pl: &VolumeBinding, pod: &Pod, nodes: &[Node]) -> Result<Vec<Outcome>, Outcome> {
    let mut st = CycleState::new();
    let (_, s) = pl.pre_filter(&mut st, pod, &Snapshot::default());
    if !s.is_success() {
        return Err((s.code, s.reasons));
    }
    Ok(nodes
        .iter()
        .map(|n| {
            let s = pl.filter(&st, pod, &NodeInfo::new(Arc::new(n.clone())));
            (s.code, s.reasons)
        })
        .collect())
}

fn ok() -> (Code, Vec<String>) {
    (Code::Success, vec![])
}

fn no(reasons: &[&str]) -> (Code, Vec<String>) {
    (
        Code::UnschedulableAndUnresolvable,
        reasons.iter().map(|r| r.to_string()).collect(),
    )
}

#[test]
fn pre_filter_errors_as_upstream() {
    let mut eph_not_ours = (*pvc("p-eph", WFFC, "1Gi", json!({}))).clone();
    eph_not_ours.metadata.owner_references = None;
    let pl = plugin(objects(
        vec![],
        vec![
            pvc("immediate-unbound", IMMEDIATE, "1Gi", json!({})),
            pvc("no-class-unbound", "", "1Gi", json!({})),
            pvc("missing-class", "gone", "1Gi", json!({})),
            pvc(
                "lost",
                WFFC,
                "1Gi",
                json!({"spec": {"volumeName": "v"}, "status": {"phase": "Lost"}}),
            ),
            pvc(
                "deleting",
                WFFC,
                "1Gi",
                json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z", "finalizers": ["x"]}}),
            ),
            pvc(
                "prebound",
                WFFC,
                "1Gi",
                json!({"spec": {"volumeName": "v"}}),
            ),
            Arc::new(eph_not_ours),
        ],
    ));
    let n = [node("n1", "z1")];
    let un = |m: &str| Err((Code::UnschedulableAndUnresolvable, vec![m.to_string()]));
    let immediate = un("pod has unbound immediate PersistentVolumeClaims");
    let cases = [
        ("missing claim", pod(&["nope"]), un("persistentvolumeclaim \"nope\" not found")),
        ("unbound immediate claim", pod(&["immediate-unbound"]), immediate.clone()),
        ("no class: immediate", pod(&["no-class-unbound"]), immediate.clone()),
        ("class not found: immediate", pod(&["missing-class"]), immediate.clone()),
        ("pre-bound claim: immediate", pod(&["prebound"]), immediate.clone()),
        ("lost claim", pod(&["lost"]), un("persistentvolumeclaim \"lost\" bound to non-existent persistentvolume \"v\"")),
        ("claim being deleted", pod(&["deleting"]), un("persistentvolumeclaim \"deleting\" is being deleted")),
        (
            "ephemeral claim not yet created",
            pod_with(json!([{"name": "scratch", "ephemeral": {}}])),
            un("waiting for ephemeral volume controller to create the persistentvolumeclaim \"p-scratch\""),
        ),
        (
            "ephemeral claim not owned by the pod",
            pod_with(json!([{"name": "eph", "ephemeral": {}}])),
            un("PVC ns/p-eph was not created for pod ns/p (pod is not owner)"),
        ),
    ];
    for (name, p, want) in cases {
        assert_eq!(run(&pl, &p, &n), want, "{name}");
    }
    // No claims: skip.
    let mut st = CycleState::new();
    let (_, s) = pl.pre_filter(&mut st, &pod(&[]), &Snapshot::default());
    assert_eq!(s.code, Code::Skip);
}

#[test]
fn bound_claims_check_their_volumes_node_affinity_on_every_node() {
    let pl = plugin(objects(
        vec![
            pv(
                "local-n1",
                WFFC,
                "1Gi",
                Some("n1"),
                json!({"spec": {"claimRef": {"name": "c1", "namespace": "ns"}}}),
            ),
            pv(
                "local-n2",
                WFFC,
                "1Gi",
                Some("n2"),
                json!({"spec": {"claimRef": {"name": "c2", "namespace": "ns"}}}),
            ),
            pv(
                "zonal",
                WFFC,
                "1Gi",
                None,
                json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]}]}}}}),
            ),
        ],
        vec![
            pvc("c1", WFFC, "1Gi", bound_to("local-n1")),
            pvc("c2", WFFC, "1Gi", bound_to("local-n2")),
            pvc("cz", WFFC, "1Gi", bound_to("zonal")),
            pvc("c-gone", WFFC, "1Gi", bound_to("gone")),
        ],
    ));
    // Every node is filtered: no PreFilter narrowing to the local volume's node (as v1.34).
    let mut st = CycleState::new();
    let (r, s) = pl.pre_filter(&mut st, &pod(&["c1"]), &Snapshot::default());
    assert!(s.is_success() && r.is_none(), "{s}");
    let nodes = [node("n1", "z1"), node("n2", "z2")];
    assert_eq!(
        run(&pl, &pod(&["c1"]), &nodes),
        Ok(vec![ok(), no(&[ERR_REASON_NODE_CONFLICT])])
    );
    assert_eq!(
        run(&pl, &pod(&["cz"]), &nodes),
        Ok(vec![ok(), no(&[ERR_REASON_NODE_CONFLICT])])
    );
    assert_eq!(
        run(&pl, &pod(&["c-gone"]), &nodes),
        Ok(vec![
            no(&[ERR_REASON_PV_NOT_EXIST]),
            no(&[ERR_REASON_PV_NOT_EXIST])
        ])
    );
}

#[test]
fn wait_for_first_consumer_claims_find_volumes_or_a_provisioner() {
    let pl = plugin(objects(
        vec![
            pv("n1-small", WFFC, "1Gi", Some("n1"), json!({})),
            pv("n1-big", WFFC, "10Gi", Some("n1"), json!({})),
            pv("n2-big", WFFC, "10Gi", Some("n2"), json!({})),
        ],
        vec![
            pvc("small", WFFC, "1Gi", json!({})),
            pvc("big", WFFC, "5Gi", json!({})),
            pvc("huge", WFFC, "50Gi", json!({})),
            pvc("dyn", PROVISIONED, "1Gi", json!({})),
            pvc("topo", TOPOLOGY, "1Gi", json!({})),
            pvc(
                "selected-n2",
                PROVISIONED,
                "1Gi",
                json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "n2"}}}),
            ),
        ],
    ));
    let nodes = [node("n1", "z1"), node("n2", "z2"), node("n3", "z1")];
    let none = no(&[ERR_REASON_BIND_CONFLICT]);
    let cases = [
        (
            "one small claim: n1 and n2 have a volume big enough",
            vec!["small"],
            vec![ok(), ok(), none.clone()],
        ),
        (
            "two claims on n1: each its own volume",
            vec!["small", "big"],
            vec![ok(), none.clone(), none.clone()],
        ),
        (
            "too big for every volume, no provisioner",
            vec!["huge"],
            vec![none.clone(), none.clone(), none.clone()],
        ),
        (
            "a provisioner: every node",
            vec!["dyn"],
            vec![ok(), ok(), ok()],
        ),
        (
            "allowedTopologies: zone z1 only",
            vec!["topo"],
            vec![ok(), none.clone(), ok()],
        ),
        (
            "selected node already set: that node only",
            vec!["selected-n2"],
            vec![none.clone(), ok(), none.clone()],
        ),
    ];
    for (name, claims, want) in cases {
        assert_eq!(run(&pl, &pod(&claims), &nodes), Ok(want), "{name}");
    }
}

#[test]
fn matching_volume_is_the_smallest_that_fits_every_criterion() {
    let n1 = node("n1", "z1");
    let claim = pvc("c", WFFC, "2Gi", json!({}));
    let pick = |pvs: Vec<Arc<PersistentVolume>>, claim: &PersistentVolumeClaim| {
        find_matching_volume(claim, &pvs, &n1, &HashSet::new())
            .unwrap()
            .map(|p| p.metadata.name.clone().unwrap())
    };
    let name = |s: &str| Some(s.to_string());
    type Case = (&'static str, Vec<Arc<PersistentVolume>>, Option<String>);
    let cases: Vec<Case> = vec![
        (
            "smallest that fits",
            vec![
                pv("a", WFFC, "10Gi", None, json!({})),
                pv("b", WFFC, "3Gi", None, json!({})),
                pv("c", WFFC, "1Gi", None, json!({})),
            ],
            name("b"),
        ),
        (
            "exact size",
            vec![pv("a", WFFC, "2Gi", None, json!({}))],
            name("a"),
        ),
        (
            "other class",
            vec![pv("a", IMMEDIATE, "5Gi", None, json!({}))],
            None,
        ),
        (
            "not Available",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"status": {"phase": "Released"}}),
            )],
            None,
        ),
        (
            "bound to another claim",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"spec": {"claimRef": {"name": "x", "namespace": "ns"}}}),
            )],
            None,
        ),
        (
            "pre-bound to this claim wins over a smaller free one",
            vec![
                pv("a", WFFC, "2Gi", None, json!({})),
                pv(
                    "b",
                    WFFC,
                    "9Gi",
                    None,
                    json!({"spec": {"claimRef": {"name": "c", "namespace": "ns"}}, "status": {"phase": "Bound"}}),
                ),
            ],
            name("b"),
        ),
        (
            "pre-bound to this claim but on another node",
            vec![
                pv("a", WFFC, "2Gi", None, json!({})),
                pv(
                    "b",
                    WFFC,
                    "9Gi",
                    Some("n2"),
                    json!({"spec": {"claimRef": {"name": "c", "namespace": "ns"}}}),
                ),
            ],
            None,
        ),
        (
            "access mode missing",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"spec": {"accessModes": ["ReadOnlyMany"]}}),
            )],
            None,
        ),
        (
            "block volume for a filesystem claim",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"spec": {"volumeMode": "Block"}}),
            )],
            None,
        ),
        (
            "being deleted",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z", "finalizers": ["x"]}}),
            )],
            None,
        ),
        (
            "node affinity elsewhere",
            vec![pv("a", WFFC, "5Gi", Some("n2"), json!({}))],
            None,
        ),
        (
            "volume attributes class differs",
            vec![pv(
                "a",
                WFFC,
                "5Gi",
                None,
                json!({"spec": {"volumeAttributesClassName": "gold"}}),
            )],
            None,
        ),
    ];
    for (case, pvs, want) in cases {
        assert_eq!(pick(pvs, &claim), want, "{case}");
    }
    let selective = pvc(
        "c",
        WFFC,
        "1Gi",
        json!({"spec": {"selector": {"matchLabels": {"disk": "ssd"}}}}),
    );
    assert_eq!(
        pick(
            vec![
                pv(
                    "hdd",
                    WFFC,
                    "1Gi",
                    None,
                    json!({"metadata": {"labels": {"disk": "hdd"}}})
                ),
                pv(
                    "ssd",
                    WFFC,
                    "5Gi",
                    None,
                    json!({"metadata": {"labels": {"disk": "ssd"}}})
                )
            ],
            &selective
        ),
        name("ssd"),
        "selector"
    );
}

#[test]
fn reserve_assumes_the_volume_so_the_next_pod_takes_another_and_unreserve_gives_it_back() {
    let pl = plugin(objects(
        vec![
            pv("v1", WFFC, "1Gi", Some("n1"), json!({})),
            pv("v2", WFFC, "1Gi", Some("n1"), json!({})),
        ],
        vec![
            pvc("a", WFFC, "1Gi", json!({})),
            pvc("b", WFFC, "1Gi", json!({})),
            pvc("c", WFFC, "1Gi", json!({})),
        ],
    ));
    let nodes = [node("n1", "z1")];
    let schedule = |claim: &str| -> (CycleState, Pod, Status) {
        let p = pod(&[claim]);
        let mut st = CycleState::new();
        let (_, s) = pl.pre_filter(&mut st, &p, &Snapshot::default());
        assert!(s.is_success(), "{s}");
        let s = pl.filter(&st, &p, &NodeInfo::new(Arc::new(nodes[0].clone())));
        if !s.is_success() {
            return (st, p, s);
        }
        let s = pl.reserve(&mut st, &p, "n1");
        (st, p, s)
    };
    let (_, _, s) = schedule("a");
    assert!(s.is_success(), "{s}");
    let a_vol = pl.assume_cache().get_pv("v1").unwrap();
    assert_eq!(
        a_vol
            .spec
            .as_ref()
            .unwrap()
            .claim_ref
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("a"),
        "the first claim took the first volume (name order among equals)"
    );
    assert_eq!(
        a_vol.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    let (mut st_b, p_b, s) = schedule("b");
    assert!(s.is_success(), "{s}");
    let (_, _, s) = schedule("c");
    assert_eq!(
        s.reasons,
        vec![ERR_REASON_BIND_CONFLICT.to_string()],
        "both volumes assumed"
    );
    pl.unreserve(&mut st_b, &p_b, "n1");
    let (_, _, s) = schedule("c");
    assert!(
        s.is_success(),
        "after b's Unreserve its volume is free again: {s}"
    );
}

#[test]
fn reserve_assumes_the_selected_node_of_claims_to_provision() {
    let pl = plugin(objects(
        vec![],
        vec![pvc("d", PROVISIONED, "1Gi", json!({}))],
    ));
    let p = pod(&["d"]);
    let mut st = CycleState::new();
    let (_, s) = pl.pre_filter(&mut st, &p, &Snapshot::default());
    assert!(s.is_success());
    assert!(pl
        .filter(&st, &p, &NodeInfo::new(Arc::new(node("n2", "z2"))))
        .is_success());
    assert!(pl.reserve(&mut st, &p, "n2").is_success());
    let claim = pl.assume_cache().get_pvc("ns", "d").unwrap();
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()["volume.kubernetes.io/selected-node"],
        "n2"
    );
    // The next cycle of the same Pod sees the assumed selected node: only n2.
    let r = run(&pl, &p, &[node("n1", "z1"), node("n2", "z2")]);
    assert_eq!(r, Ok(vec![no(&[ERR_REASON_BIND_CONFLICT]), ok()]));
    pl.unreserve(&mut st, &p, "n2");
    let r = run(&pl, &p, &[node("n1", "z1"), node("n2", "z2")]);
    assert_eq!(r, Ok(vec![ok(), ok()]));
}
