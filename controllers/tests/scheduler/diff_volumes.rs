//! Volume scheduling under both schedulers, with kube-controller-manager's
//! persistentvolume-binder completing the bindings: each scheduler gets the same world of its own
//! (nodes `vol-<impl>-n1..n3`, labelled and tainted `kpr.test/vol-set=<impl>`, zones za, za, zb;
//! StorageClasses, PersistentVolumes and CSINodes named after the implementation; namespace
//! `vol-<impl>`) and the same script; the outcomes, with the implementation's name taken out,
//! must be equal:
//!
//! 1. a StatefulSet-like set (`web-0..2`, one WaitForFirstConsumer claim each, class
//!    `kubernetes.io/no-provisioner`, local volumes pinned to one node each by node affinity,
//!    sized so that, created one after the other, each Pod has one choice): the node each lands
//!    on and the volume each claim is bound to; then `web-0` deleted and created again: back on
//!    the node of its volume;
//! 2. a Pod whose claim is bound to a volume on a node too small for it, a Pod whose volume is
//!    in a zone no node has, a Pod whose CSI volumes exceed every node's CSINode count, a claim
//!    matching no volume, a missing claim, an unbound Immediate claim, a claim naming a class
//!    that does not exist, a claim bound to a volume whose node affinity names no node, two
//!    claims bound to volumes on two different nodes: the FitError, word for word; then a Pod
//!    without volumes is still scheduled (the bad input held nothing up);
//! 3. a Pod whose claim is to be provisioned (a CSI class, WaitForFirstConsumer) where only one
//!    node's CSINode has room: the node written to the claim's `volume.kubernetes.io/selected-node`
//!    (no provisioner runs here, so the Pod itself waits in PreBind and is not compared); a claim
//!    of a provisioner whose class's `allowedTopologies` names zone zb: the node selected (the
//!    only one in zb); one whose class allows only a zone no node has: the FitError.
//!
//! Owns those objects; never sleeps to assert: it waits on the Pods' and claims' state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::diff_cluster::{create_nodes, namespace, node_of, scheduled_condition, Impl, NodeSpec};

const SET: &str = "kpr.test/vol-set";
const ZONE: &str = "topology.kubernetes.io/zone";
const CSI_DRIVER: &str = "csi.kpr.test";
/// A provisioner that is no CSI driver of any CSINode: no attach limit applies to its claims.
const TOPOLOGY_PROVISIONER: &str = "topology.kpr.test/provisioner";

fn ns(imp: Impl) -> String {
    format!("vol-{}", imp.tag())
}

/// An object name of this implementation's world.
fn named(imp: Impl, what: &str) -> String {
    format!("vol-{}-{what}", imp.tag())
}

/// Nodes (before the schedulers start: the other parts' FitErrors count every node), classes,
/// volumes and CSINodes.
pub async fn setup(client: &Client) -> anyhow::Result<()> {
    for imp in Impl::BOTH {
        namespace(client, &ns(imp)).await?;
        let nodes: Vec<NodeSpec> = [("n1", "za", "1"), ("n2", "za", "4"), ("n3", "zb", "4")]
            .iter()
            .map(|(n, zone, cpu)| NodeSpec {
                name: named(imp, n),
                labels: [
                    (SET.into(), imp.tag().into()),
                    (ZONE.into(), zone.to_string()),
                ]
                .into_iter()
                .collect(),
                taints: vec![json!({"key": SET, "value": imp.tag(), "effect": "NoSchedule"})],
                allocatable: [
                    ("cpu".to_string(), cpu.to_string()),
                    ("memory".into(), "8Gi".into()),
                    ("pods".into(), "20".into()),
                ]
                .into_iter()
                .collect(),
                unschedulable: false,
            })
            .collect();
        create_nodes(client, &nodes).await?;
        let classes: Api<StorageClass> = Api::all(client.clone());
        for (what, provisioner, mode) in [
            (
                "local",
                "kubernetes.io/no-provisioner",
                "WaitForFirstConsumer",
            ),
            ("immediate", "kubernetes.io/no-provisioner", "Immediate"),
            ("csi", CSI_DRIVER, "WaitForFirstConsumer"),
            ("topology-zb", TOPOLOGY_PROVISIONER, "WaitForFirstConsumer"),
            ("topology-zc", TOPOLOGY_PROVISIONER, "WaitForFirstConsumer"),
        ] {
            let mut sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": named(imp, what)},
                "provisioner": provisioner, "volumeBindingMode": mode});
            // The provisioner may create volumes only in the zone the class's name ends with.
            if let Some(zone) = what.strip_prefix("topology-") {
                sc["allowedTopologies"] =
                    json!([{"matchLabelExpressions": [{"key": ZONE, "values": [zone]}]}]);
            }
            classes
                .create(&PostParams::default(), &serde_json::from_value(sc)?)
                .await
                .with_context(|| format!("creating StorageClass {}", named(imp, what)))?;
        }
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        for pv in volumes(imp) {
            pvs.create(&PostParams::default(), &serde_json::from_value(pv)?)
                .await
                .context("creating a PersistentVolume")?;
        }
        let csinodes: Api<CSINode> = Api::all(client.clone());
        for (n, count) in [("n1", 0), ("n2", 0), ("n3", 1)] {
            let c = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": named(imp, n)},
                "spec": {"drivers": [{"name": CSI_DRIVER, "nodeID": named(imp, n),
                    "allocatable": {"count": count}}]}});
            csinodes
                .create(&PostParams::default(), &serde_json::from_value(c)?)
                .await
                .with_context(|| format!("creating CSINode {}", named(imp, n)))?;
        }
    }
    Ok(())
}

/// The volumes: local ones of 1, 2 and 3 GiB on n1, n2, n3 (class `local`); one of class
/// `immediate` on n1 pre-bound to claim `pinned`; one of class `immediate` labelled with a zone
/// no node has, pre-bound to claim `zoned`; of class `immediate`, pre-bound: one whose node
/// affinity names a node that does not exist (claim `affinity-nowhere`), one on n1 and one on
/// n2 (claims `split-a`, `split-b`).
fn volumes(imp: Impl) -> Vec<Value> {
    let local = |n: &str, size: &str, class: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": named(imp, &format!("{class}-{n}"))},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": named(imp, class),
                "local": {"path": "/mnt/disk"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [named(imp, n)]}]}]}}}})
    };
    let mut pinned = local("n1", "1Gi", "immediate");
    pinned["spec"]["claimRef"] = json!({"namespace": ns(imp), "name": "pinned"});
    let zoned = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": named(imp, "zoned"), "labels": {ZONE: "zc"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": named(imp, "immediate"),
            "hostPath": {"path": "/tmp/zoned"},
            "claimRef": {"namespace": ns(imp), "name": "zoned"}}});
    let prebound = |name: &str, node: &str, claim: &str| {
        let mut v = local(node, "1Gi", "immediate");
        v["metadata"]["name"] = json!(named(imp, name));
        v["spec"]["claimRef"] = json!({"namespace": ns(imp), "name": claim});
        v
    };
    vec![
        local("n1", "1Gi", "local"),
        local("n2", "2Gi", "local"),
        local("n3", "3Gi", "local"),
        pinned,
        zoned,
        prebound("nowhere", "n9", "affinity-nowhere"),
        prebound("split-a", "n1", "split-a"),
        prebound("split-b", "n2", "split-b"),
    ]
}

fn claim(imp: Impl, name: &str, class: &str, size: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": named(imp, class),
            "resources": {"requests": {"storage": size}}}})
}

fn pod(imp: Impl, name: &str, claims: &[&str], cpu: &str) -> Value {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"schedulerName": imp.place_name(), "nodeSelector": {SET: imp.tag()},
            "tolerations": [{"key": SET, "operator": "Equal", "value": imp.tag(), "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": cpu}}}],
            "volumes": volumes}})
}

/// Polls `f` every 100 ms until it gives a value, for at most 60 s.
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Pod's fate: its node (this implementation's name taken out) or its FitError.
async fn settled(pods: &Api<Pod>, imp: Impl, name: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("{}/{name} to be bound or unschedulable", ns(imp)),
        || async {
            let p = pods.get(name).await?;
            if let Some(n) = node_of(&p) {
                return Ok(Some(format!("on {}", generic(imp, n))));
            }
            Ok(scheduled_condition(&p)
                .filter(|(reason, _)| reason == "Unschedulable")
                .map(|(_, m)| format!("unschedulable: {}", generic(imp, &m))))
        },
    )
    .await
}

/// A name of either world made the same: `vol-<impl>-` becomes `vol-X-`.
fn generic(imp: Impl, s: &str) -> String {
    s.replace(&format!("vol-{}-", imp.tag()), "vol-X-")
}

/// The claim's bound volume, once the PV controller has completed it.
async fn bound_volume(
    claims: &Api<PersistentVolumeClaim>,
    imp: Impl,
    name: &str,
) -> anyhow::Result<String> {
    wait_for(&format!("claim {name} to be bound"), || async {
        let c = claims.get(name).await?;
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        let vol = c.spec.as_ref().and_then(|s| s.volume_name.clone());
        Ok((phase == Some("Bound")).then(|| generic(imp, &vol.unwrap_or_default())))
    })
    .await
}

/// The node the scheduler wrote to the claim's `volume.kubernetes.io/selected-node`, once it has.
async fn selected_node(
    claims: &Api<PersistentVolumeClaim>,
    imp: Impl,
    name: &str,
) -> anyhow::Result<String> {
    wait_for(&format!("claim {name}'s selected node"), || async {
        let c = claims.get(name).await?;
        Ok(c.metadata
            .annotations
            .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned())
            .map(|n| generic(imp, &n)))
    })
    .await
}

/// Runs the script against one scheduler; the outcomes by step.
async fn script(client: &Client, imp: Impl) -> anyhow::Result<BTreeMap<String, String>> {
    let ns = ns(imp);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let mut out = BTreeMap::new();
    let create_claim = |v: Value| {
        let claims = claims.clone();
        async move {
            claims
                .create(&PostParams::default(), &serde_json::from_value(v)?)
                .await
                .context("creating a claim")?;
            anyhow::Ok(())
        }
    };
    let create_pod = |v: Value| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &serde_json::from_value(v)?)
                .await
                .context("creating a Pod")?;
            anyhow::Ok(())
        }
    };
    // 1. The set, one after the other as a StatefulSet creates its Pods: 3, 2, 1 GiB.
    for (i, size) in ["3Gi", "2Gi", "1Gi"].iter().enumerate() {
        let c = format!("data-web-{i}");
        let p = format!("web-{i}");
        create_claim(claim(imp, &c, "local", size)).await?;
        create_pod(pod(imp, &p, &[&c], "100m")).await?;
        out.insert(format!("1 {p} node"), settled(&pods, imp, &p).await?);
        out.insert(
            format!("1 {c} volume"),
            bound_volume(&claims, imp, &c).await?,
        );
    }
    pods.delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .context("deleting web-0")?;
    wait_for("web-0 to be gone", || async {
        Ok(pods.get_opt("web-0").await?.is_none().then_some(()))
    })
    .await?;
    create_pod(pod(imp, "web-0", &["data-web-0"], "100m")).await?;
    out.insert(
        "1 web-0 again node".into(),
        settled(&pods, imp, "web-0").await?,
    );

    // 2. Pods that fit nowhere.
    create_claim(claim(imp, "pinned", "immediate", "1Gi")).await?;
    create_claim(claim(imp, "zoned", "immediate", "1Gi")).await?;
    create_claim(claim(imp, "nomatch", "local", "100Gi")).await?;
    create_claim(claim(imp, "unbound-immediate", "immediate", "5Gi")).await?;
    create_claim(claim(imp, "csi-a", "csi", "1Gi")).await?;
    create_claim(claim(imp, "csi-b", "csi", "1Gi")).await?;
    create_claim(claim(imp, "missing-class", "gone", "1Gi")).await?;
    for c in ["affinity-nowhere", "split-a", "split-b"] {
        create_claim(claim(imp, c, "immediate", "1Gi")).await?;
        out.insert(
            format!("2 {c} volume"),
            bound_volume(&claims, imp, c).await?,
        );
    }
    out.insert(
        "2 pinned volume".into(),
        bound_volume(&claims, imp, "pinned").await?,
    );
    out.insert(
        "2 zoned volume".into(),
        bound_volume(&claims, imp, "zoned").await?,
    );
    let nowhere = [
        ("full-node", vec!["pinned"], "2"),
        ("zone-conflict", vec!["zoned"], "100m"),
        ("csi-over-limit", vec!["csi-a", "csi-b"], "100m"),
        ("no-matching-volume", vec!["nomatch"], "100m"),
        ("missing-claim", vec!["missing"], "100m"),
        ("unbound-immediate", vec!["unbound-immediate"], "100m"),
        ("missing-class", vec!["missing-class"], "100m"),
        ("affinity-nowhere", vec!["affinity-nowhere"], "100m"),
        ("claims-on-two-nodes", vec!["split-a", "split-b"], "100m"),
    ];
    for (name, cs, cpu) in &nowhere {
        create_pod(pod(imp, name, cs, cpu)).await?;
    }
    for (name, _, _) in &nowhere {
        out.insert(format!("2 {name}"), settled(&pods, imp, name).await?);
    }
    // Nothing else is held up: a Pod without volumes is scheduled after them.
    create_pod(pod(imp, "no-volumes", &[], "100m")).await?;
    let fate = settled(&pods, imp, "no-volumes").await?;
    out.insert(
        "2 no-volumes after the bad input".into(),
        if fate.starts_with("on ") {
            "scheduled".into()
        } else {
            fate
        },
    );

    // 3. A claim to provision where one node's CSINode has room.
    create_claim(claim(imp, "csi-one", "csi", "1Gi")).await?;
    create_pod(pod(imp, "csi-one", &["csi-one"], "100m")).await?;
    out.insert(
        "3 csi-one selected node".into(),
        selected_node(&claims, imp, "csi-one").await?,
    );
    // A provisioner limited by its class's allowedTopologies: to zone zb (n3 only), then to zone
    // zc, which no node has.
    create_claim(claim(imp, "topology-zb", "topology-zb", "1Gi")).await?;
    create_pod(pod(imp, "topology-zb", &["topology-zb"], "100m")).await?;
    out.insert(
        "3 topology-zb selected node".into(),
        selected_node(&claims, imp, "topology-zb").await?,
    );
    create_claim(claim(imp, "topology-zc", "topology-zc", "1Gi")).await?;
    create_pod(pod(imp, "topology-zc", &["topology-zc"], "100m")).await?;
    out.insert(
        "3 topology-zc".into(),
        settled(&pods, imp, "topology-zc").await?,
    );
    Ok(out)
}

/// Each step's outcome under kube-scheduler and kpr.
pub struct Report {
    pub rows: Vec<(String, String, String)>,
    pub elapsed: Duration,
}

impl Report {
    pub fn differences(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(_, u, k)| u != k)
            .map(|(step, u, k)| format!("volumes: {step}: kube-scheduler {u:?}, kpr {k:?}"))
            .collect()
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "both scripts in {:.1?}\nstep | kube-scheduler | kpr\n",
            self.elapsed
        );
        for (step, u, k) in &self.rows {
            out.push_str(&format!("{step} | {u} | {k}\n"));
        }
        out
    }
}

/// Both scripts at once (separate worlds), then step by step side by side.
pub async fn run(client: &Client) -> anyhow::Result<Report> {
    let start = Instant::now();
    let (u, k) = tokio::join!(script(client, Impl::Upstream), script(client, Impl::Kpr));
    let (u, k) = (
        u.context("under kube-scheduler")?,
        k.context("under kpr's scheduler")?,
    );
    let steps: std::collections::BTreeSet<&String> = u.keys().chain(k.keys()).collect();
    let missing = || "(missing)".to_string();
    Ok(Report {
        elapsed: start.elapsed(),
        rows: steps
            .into_iter()
            .map(|s| {
                (
                    s.clone(),
                    u.get(s).cloned().unwrap_or_else(missing),
                    k.get(s).cloned().unwrap_or_else(missing),
                )
            })
            .collect(),
    })
}
