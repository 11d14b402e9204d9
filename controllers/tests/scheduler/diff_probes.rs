//! Feasibility, differentially: for every probe Pod and every probe node, whether the Pod may go
//! there, under kube-scheduler and under ours, on the same cluster state; and, for a Pod that
//! fits nowhere, the FitError message ("0/N nodes are available: ...").
//!
//! Method. Every probe node carries a taint of its own, `kpr.test/pin=<node>:NoSchedule`; the
//! copy of a probe meant for node N tolerates N's pin only, so every other node fails in
//! TaintToleration and only N's feasibility decides. (A taint pins without touching the plugins
//! under test: topology spread ignores taints by default, while pinning through node affinity
//! would shrink spread's domains to N under nodeAffinityPolicy Honor.) The probe schedulers may
//! not bind ([`super::diff_cluster`]): a copy that fits fails its binding (SchedulerError,
//! "forbidden"), one that does not gets Unschedulable with the FitError message, and no probe
//! ever changes the cluster. A copy that fits is assumed on N between Reserve and its failed
//! binding (and again on each retry until it is deleted), so each scheduler has one worker per
//! probe node, running every probe there in turn: at most one copy per scheduler and node at a
//! time, each deleted once decided and before the next is created. A copy on N can still affect
//! copies on other nodes through labels (spread counts, pod affinity): [`check_independent`]
//! proves no probe's selectors match another probe's labels, and copies of a probe that selects
//! its own labels hold that probe's lock. A pair whose outcomes differ is run again on its own
//! before it counts as a difference (a deleted copy's last retry may still have been assumed on
//! the node when the next copy came).
//!
//! Owns: namespace `diff-probe`, the probe nodes `p*-*` and the fixture Pods bound to them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::diff_cluster::{create_nodes, namespace, node_of, scheduled_condition, Impl, NodeSpec};

pub const NS: &str = "diff-probe";
const PIN: &str = "kpr.test/pin";
pub const ZONE: &str = "kpr.test/zone";
/// How long one copy's decision may take.
const COPY_WAIT: Duration = Duration::from_secs(30);

fn node(
    name: &str,
    cpu: &str,
    memory: &str,
    pods: &str,
    labels: &[(&str, &str)],
    mut taints: Vec<Value>,
    unschedulable: bool,
) -> NodeSpec {
    taints.push(json!({"key": PIN, "value": name, "effect": "NoSchedule"}));
    NodeSpec {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        taints,
        allocatable: [("cpu", cpu), ("memory", memory), ("pods", pods)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        unschedulable,
    }
}

/// The probe nodes: three zones (and one node without a zone), varied capacity, labels, taints
/// of every effect, a cordoned node, a full one, one with an extended resource.
pub fn nodes() -> Vec<NodeSpec> {
    let taint = |k: &str, v: &str, e: &str| json!({"key": k, "value": v, "effect": e});
    let mut fpga = node(
        "pc-3",
        "8",
        "16Gi",
        "110",
        &[(ZONE, "c"), ("disk", "hdd")],
        vec![],
        false,
    );
    fpga.allocatable
        .insert("example.com/fpga".into(), "2".into());
    vec![
        node(
            "pa-1",
            "4",
            "8Gi",
            "110",
            &[(ZONE, "a"), ("disk", "ssd"), ("rank", "3")],
            vec![],
            false,
        ),
        node(
            "pa-2",
            "8",
            "16Gi",
            "110",
            &[(ZONE, "a"), ("disk", "hdd"), ("gpu", "true"), ("rank", "7")],
            vec![taint("dedicated", "gpu", "NoSchedule")],
            false,
        ),
        node(
            "pa-3",
            "2",
            "8Gi",
            "3",
            &[(ZONE, "a"), ("rank", "1")],
            vec![],
            false,
        ),
        node(
            "pb-1",
            "16",
            "32Gi",
            "110",
            &[(ZONE, "b"), ("disk", "ssd"), ("rank", "9")],
            vec![],
            false,
        ),
        node(
            "pb-2",
            "4",
            "8Gi",
            "110",
            &[(ZONE, "b"), ("rank", "5")],
            vec![taint("maint", "true", "NoExecute")],
            false,
        ),
        node(
            "pb-3",
            "8",
            "16Gi",
            "110",
            &[(ZONE, "b"), ("disk", "ssd")],
            vec![],
            true,
        ),
        node(
            "pb-4",
            "8",
            "16Gi",
            "110",
            &[(ZONE, "b"), ("disk", "hdd"), ("rank", "6")],
            vec![taint("soft", "yes", "PreferNoSchedule")],
            false,
        ),
        node(
            "pc-1",
            "4",
            "8Gi",
            "110",
            &[(ZONE, "c"), ("disk", "ssd"), ("rank", "10")],
            vec![],
            false,
        ),
        node("pc-2", "8", "2Gi", "110", &[(ZONE, "c")], vec![], false),
        fpga,
        node("pc-4", "1", "8Gi", "110", &[(ZONE, "c")], vec![], false),
        node(
            "pn-1",
            "8",
            "16Gi",
            "110",
            &[("disk", "ssd")],
            vec![],
            false,
        ),
    ]
}

fn container(cpu: &str, memory: &str) -> Value {
    json!({"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": memory}}})
}

/// A Pod: one container requesting `cpu` and 16Mi, then `extra` merged into the spec.
fn pod(name: &str, labels: Value, cpu: &str, extra: Value) -> Value {
    let mut spec =
        json!({"containers": [container(cpu, "16Mi")], "terminationGracePeriodSeconds": 0});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels}, "spec": spec})
}

fn anti(selector: Value, key: &str) -> Value {
    json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": selector, "topologyKey": key}]}})
}

fn host_port(port: u16, protocol: &str) -> Value {
    json!([{"name": "c", "image": "busybox",
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
        "ports": [{"containerPort": port, "hostPort": port, "protocol": protocol}]}])
}

/// The Pods already bound (by nodeName, no scheduler involved) when the probes run. Zone counts
/// of `app=web`: a 3, b 1, c 0; of `app in (web, db)`: a 4, b 1, c 1; `app=spread-self`: b 2.
/// pa-1 has 1 CPU left, pa-3 no Pod slot, pc-4 100m; hostPort 8080/TCP is taken on pb-1 and
/// pc-2; `app=db` Pods keep `app=cache` out of zone a and off pc-2.
fn fixtures() -> Vec<(Value, &'static str)> {
    let web = json!({"app": "web"});
    vec![
        (pod("web-1", web.clone(), "1", json!({})), "pa-1"),
        (pod("web-2", web.clone(), "1500m", json!({})), "pa-1"),
        (
            pod(
                "db-zone",
                json!({"app": "db"}),
                "500m",
                json!({"affinity": anti(json!({"matchLabels": {"app": "cache"}}), ZONE)}),
            ),
            "pa-1",
        ),
        (pod("web-3", web.clone(), "100m", json!({})), "pa-3"),
        (
            pod("filler-1", json!({"app": "filler"}), "100m", json!({})),
            "pa-3",
        ),
        (
            pod("filler-2", json!({"app": "filler"}), "100m", json!({})),
            "pa-3",
        ),
        (
            pod(
                "web-4",
                web.clone(),
                "1",
                json!({"containers": host_port(8080, "TCP")}),
            ),
            "pb-1",
        ),
        (
            pod("self-1", json!({"app": "spread-self"}), "100m", json!({})),
            "pb-1",
        ),
        (
            pod("self-2", json!({"app": "spread-self"}), "100m", json!({})),
            "pb-1",
        ),
        (
            pod(
                "db-host",
                json!({"app": "db"}),
                "100m",
                json!({"affinity": anti(json!({"matchLabels": {"app": "cache"}}), "kubernetes.io/hostname")}),
            ),
            "pc-2",
        ),
        (
            pod(
                "port-1",
                json!({"app": "port"}),
                "100m",
                json!({"containers": host_port(8080, "TCP")}),
            ),
            "pc-2",
        ),
        (
            pod("filler-3", json!({"app": "filler"}), "900m", json!({})),
            "pc-4",
        ),
    ]
}

/// One probe: a Pod shape whose feasibility is compared.
pub struct Probe {
    pub name: &'static str,
    labels: Value,
    /// Merged into the spec (the default container requests 100m and 16Mi).
    spec: Value,
}

fn probe(name: &'static str, labels: Value, spec: Value) -> Probe {
    Probe { name, labels, spec }
}

fn spread(key: &str, max_skew: u32, selector: Value, extra: Value) -> Value {
    let mut c = json!({"maxSkew": max_skew, "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    json!([c])
}

pub fn probes() -> Vec<Probe> {
    let none = || json!({});
    let web = || json!({"matchLabels": {"app": "web"}});
    let web_db =
        || json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]});
    let cpu = |c: &str| json!({"containers": [container(c, "16Mi")]});
    vec![
        probe("cpu-1", none(), cpu("1")),
        probe(
            "mem-4gi",
            none(),
            json!({"containers": [container("100m", "4Gi")]}),
        ),
        probe(
            "fpga",
            none(),
            json!({"containers": [{"name": "c", "image": "busybox", "resources": {
                "requests": {"cpu": "100m", "example.com/fpga": "1"},
                "limits": {"example.com/fpga": "1"}}}]}),
        ),
        // Effective request max(6, 1) = 6 CPUs.
        probe(
            "init-big",
            none(),
            json!({"initContainers": [{"name": "i", "image": "busybox",
                "resources": {"requests": {"cpu": "6"}}}],
                "containers": [container("1", "16Mi")]}),
        ),
        // A restartable init container (sidecar) adds to the containers: 2 + 3 = 5 CPUs.
        probe(
            "sidecar-init",
            none(),
            json!({"initContainers": [{"name": "s", "image": "busybox", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "2"}}}],
                "containers": [container("3", "16Mi")]}),
        ),
        probe(
            "tolerate-gpu",
            none(),
            json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu",
                "effect": "NoSchedule"}]}),
        ),
        probe(
            "tolerate-cordon",
            none(),
            json!({"tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "maint", "operator": "Exists"}]}),
        ),
        // (disk=ssd and zone not a) or gpu: NotIn holds where the label is absent.
        probe(
            "node-affinity",
            none(),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]},
                        {"key": ZONE, "operator": "NotIn", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}}),
        ),
        probe(
            "node-selector",
            none(),
            json!({"nodeSelector": {"disk": "ssd"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "rank", "operator": "Gt", "values": ["4"]}]}]}}}}),
        ),
        probe(
            "spread-zone",
            none(),
            json!({"topologySpreadConstraints": spread(ZONE, 1, web(), none())}),
        ),
        probe(
            "spread-self",
            json!({"app": "spread-self"}),
            json!({"topologySpreadConstraints": spread(ZONE, 1,
                json!({"matchLabels": {"app": "spread-self"}}), none())}),
        ),
        probe(
            "spread-skew3",
            none(),
            json!({"topologySpreadConstraints": spread(ZONE, 3, web_db(), none())}),
        ),
        // Fewer zones (3) than minDomains: the global minimum counts as 0.
        probe(
            "spread-mindomains",
            none(),
            json!({"topologySpreadConstraints": spread(ZONE, 3, web_db(), json!({"minDomains": 4}))}),
        ),
        // maxSkew 2 tells the inclusion policies apart: zone a counts 2 web Pods on disk=ssd
        // nodes (Honor, the default: only nodes passing the nodeSelector make the domains) but
        // 3 on all nodes (Ignore).
        probe(
            "spread-ssd-honor",
            none(),
            json!({"nodeSelector": {"disk": "ssd"},
                "topologySpreadConstraints": spread(ZONE, 2, web(), none())}),
        ),
        probe(
            "spread-ssd-ignore",
            none(),
            json!({"nodeSelector": {"disk": "ssd"},
                "topologySpreadConstraints": spread(ZONE, 2, web(),
                    json!({"nodeAffinityPolicy": "Ignore"}))}),
        ),
        probe(
            "spread-host",
            none(),
            json!({"topologySpreadConstraints": spread("kubernetes.io/hostname", 1, web(), none())}),
        ),
        probe(
            "anti-host",
            none(),
            json!({"affinity": anti(web(), "kubernetes.io/hostname")}),
        ),
        probe("anti-zone", none(), json!({"affinity": anti(web(), ZONE)})),
        probe(
            "affinity-zone",
            none(),
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}]}}}),
        ),
        // No Pod matches, but the probe matches its own term: allowed (the first of a group).
        probe(
            "affinity-self",
            json!({"app": "lonely"}),
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "lonely"}},
                    "topologyKey": "kubernetes.io/hostname"}]}}}),
        ),
        // Existing Pods' anti-affinity (app=db against app=cache).
        probe("cache", json!({"app": "cache"}), none()),
        probe(
            "host-port",
            none(),
            json!({"containers": host_port(8080, "TCP")}),
        ),
        probe(
            "host-port-udp",
            none(),
            json!({"containers": host_port(8080, "UDP")}),
        ),
        probe(
            "host-ip-port",
            none(),
            json!({"containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
                "ports": [{"containerPort": 8080, "hostPort": 8080, "hostIP": "127.0.0.1",
                    "protocol": "TCP"}]}]}),
        ),
        // matchFields on metadata.name: NodeAffinity's PreFilter narrows the nodes evaluated.
        probe(
            "match-fields",
            none(),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["pb-1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["pc-1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["pb-3"]}]}]}}}}),
        ),
        probe(
            "match-fields-none",
            none(),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["no-such-node"]}]}]}}}}),
        ),
        probe(
            "selector-nowhere",
            none(),
            json!({"nodeSelector": {"disk": "nvme"}}),
        ),
        // No node reports ephemeral-storage: a request for it fits nowhere.
        probe(
            "ephemeral",
            none(),
            json!({"containers": [{"name": "c", "image": "busybox", "resources": {"requests":
                {"cpu": "100m", "ephemeral-storage": "1Gi"}}}]}),
        ),
        // A constraint without a labelSelector selects no Pod: only the missing key matters.
        probe(
            "spread-no-selector",
            none(),
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule"}]}),
        ),
        probe("impossible", none(), cpu("100")),
        probe(
            "impossible-mixed",
            none(),
            json!({"nodeSelector": {"disk": "ssd"}, "containers": [container("15", "16Mi")]}),
        ),
    ]
}

/// Every label selector of a Pod spec (topology spread, required pod (anti-)affinity); an absent
/// one selects nothing and is left out.
fn selectors(spec: &Value) -> Vec<&Value> {
    let mut out: Vec<&Value> = spec["topologySpreadConstraints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| &c["labelSelector"])
        .collect();
    for kind in ["podAffinity", "podAntiAffinity"] {
        out.extend(
            spec["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["labelSelector"]),
        );
    }
    out.retain(|s| !s.is_null());
    out
}

/// A label selector's match (matchLabels, and In / NotIn / Exists / DoesNotExist).
fn matches(selector: &Value, labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let by_exprs = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => get(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => get(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => get(key).is_some(),
                _ => get(key).is_none(),
            }
        });
    by_labels && by_exprs
}

/// No probe's selectors match another probe's labels, so copies of different probes assumed on
/// different nodes at the same time cannot change each other's feasibility.
pub fn check_independent(probes: &[Probe]) -> anyhow::Result<()> {
    for a in probes {
        for b in probes {
            if a.name != b.name && selectors(&a.spec).iter().any(|s| matches(s, &b.labels)) {
                bail!(
                    "probe {}'s selectors match probe {}'s labels: concurrent copies would interfere",
                    a.name,
                    b.name
                );
            }
        }
    }
    Ok(())
}

/// Namespace, nodes and fixture Pods (before the schedulers start).
pub async fn setup(client: &Client) -> anyhow::Result<()> {
    namespace(client, NS).await?;
    create_nodes(client, &nodes()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (mut p, node) in fixtures() {
        p["spec"]["nodeName"] = json!(node);
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        pods.create(&PostParams::default(), &serde_json::from_value(p)?)
            .await
            .with_context(|| format!("creating fixture Pod {name} on {node}"))?;
    }
    Ok(())
}

/// What a scheduler decided for one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A node was found (its binding was refused).
    Feasible,
    /// PodScheduled=False, Unschedulable, with this message.
    Unschedulable(String),
    /// Anything else (another error, or bound although binding is refused).
    Other(String),
}

fn decide(p: &Pod) -> Option<Outcome> {
    if let Some(n) = node_of(p) {
        return Some(Outcome::Other(format!(
            "bound to {n} although binding is refused"
        )));
    }
    let (reason, message) = scheduled_condition(p)?;
    Some(match reason.as_str() {
        "Unschedulable" => Outcome::Unschedulable(message),
        "SchedulerError" if message.contains("forbidden") => Outcome::Feasible,
        _ => Outcome::Other(format!("{reason}: {message}")),
    })
}

/// Where a copy may go: one node (its pin tolerated) or any probe node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target<'a> {
    Node(&'a str),
    Any,
}

/// The copy of `probe` for `target` under `imp`.
fn copy(probe: &Probe, target: Target, imp: Impl) -> anyhow::Result<Pod> {
    let where_ = match target {
        Target::Node(n) => n,
        Target::Any => "any",
    };
    let mut labels = probe.labels.clone();
    labels["kpr-probe"] = json!(probe.name);
    let mut p = pod(
        &format!("{}-{where_}-{}", probe.name, imp.tag()),
        labels,
        "100m",
        probe.spec.clone(),
    );
    p["spec"]["schedulerName"] = json!(imp.probe_name());
    let pin = match target {
        Target::Node(n) => {
            json!({"key": PIN, "operator": "Equal", "value": n, "effect": "NoSchedule"})
        }
        Target::Any => json!({"key": PIN, "operator": "Exists", "effect": "NoSchedule"}),
    };
    let tolerations = p["spec"]["tolerations"].as_array().cloned();
    let mut tolerations = tolerations.unwrap_or_default();
    tolerations.push(pin);
    p["spec"]["tolerations"] = json!(tolerations);
    Ok(serde_json::from_value(p)?)
}

type Key<'a> = (&'a str, Target<'a>, Impl);

/// The latest version of every Pod of the probe namespace, from one watch, and a wake-up on
/// each change. The watch ends with the value.
struct Seen {
    pods: Mutex<HashMap<String, Pod>>,
    changed: Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Seen {
    fn start(client: &Client) -> Arc<Seen> {
        let seen = Arc::new(Seen {
            pods: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            task: Mutex::new(None),
        });
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        let s = Arc::downgrade(&seen);
        let task = tokio::spawn(async move {
            // Backoff: an API server gone (the test's end) must not make this a busy loop.
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = events.next().await {
                let Some(s) = s.upgrade() else { return };
                if let Ok(p) = ev {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    s.pods.lock().expect("seen lock").insert(name, p);
                    s.changed.notify_waiters();
                }
            }
        });
        *seen.task.lock().expect("seen lock") = Some(task);
        seen
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().expect("seen lock").take() {
            t.abort();
        }
    }
}

/// One copy: created, its decision awaited, deleted (the deletion done before returning, so the
/// next copy on the node never meets it).
async fn once(
    client: &Client,
    seen: &Seen,
    probe: &Probe,
    target: Target<'_>,
    imp: Impl,
) -> anyhow::Result<Outcome> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = copy(probe, target, imp)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let created = api
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating probe copy {name}"))?;
    // A copy of an earlier attempt by the same name is told apart by its uid.
    let uid = created.metadata.uid.clone();
    let deadline = Instant::now() + COPY_WAIT;
    let outcome = loop {
        let changed = seen.changed.notified();
        let decided = seen
            .pods
            .lock()
            .expect("seen lock")
            .get(&name)
            .filter(|p| p.metadata.uid == uid)
            .and_then(decide);
        if let Some(o) = decided {
            break o;
        }
        if Instant::now() > deadline {
            bail!("probe copy {name}: no decision after {COPY_WAIT:?}");
        }
        // The watch wakes us; the timeout only bounds a missed wake-up.
        let _ = tokio::time::timeout(Duration::from_millis(200), changed).await;
    };
    api.delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting probe copy {name}"))?;
    Ok(outcome)
}

/// Both schedulers' copies of each (probe, target), all at once.
async fn round<'a>(
    client: &Client,
    seen: &Seen,
    pairs: &[(&'a Probe, Target<'a>)],
) -> anyhow::Result<BTreeMap<Key<'a>, Outcome>> {
    let keys: Vec<Key<'a>> = pairs
        .iter()
        .flat_map(|(p, t)| Impl::BOTH.map(|i| (p.name, *t, i)))
        .collect();
    let got = futures::future::join_all(
        pairs
            .iter()
            .flat_map(|(p, t)| Impl::BOTH.map(|i| once(client, seen, p, *t, i))),
    )
    .await;
    keys.into_iter()
        .zip(got)
        .map(|(k, o)| Ok((k, o?)))
        .collect()
}

/// The comparison: per probe, each scheduler's feasible probe nodes, and every disagreement.
pub struct ProbeReport {
    /// probe → (upstream's feasible nodes, ours).
    pub feasible: BTreeMap<&'static str, (BTreeSet<String>, BTreeSet<String>)>,
    /// (probe, node or "any") → (upstream's outcome, ours), where they differ after a re-run.
    pub differences: Vec<(String, String, Outcome, Outcome)>,
    /// Pairs whose first outcomes differed but agreed when run again alone.
    pub reruns_agreed: Vec<(String, String)>,
    /// FitError messages compared for Pods that fit nowhere (probe → upstream's message).
    pub nowhere_messages: BTreeMap<&'static str, String>,
    pub copies: usize,
    pub elapsed: Duration,
}

impl ProbeReport {
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<18} {:>3} {:>3}  feasible probe nodes (upstream | kpr when different)\n",
            "probe", "ups", "kpr"
        );
        for (name, (u, k)) in &self.feasible {
            let list = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
            let tail = if u == k {
                list(u)
            } else {
                format!("{} | {}", list(u), list(k))
            };
            s += &format!("{name:<18} {:>3} {:>3}  {tail}\n", u.len(), k.len());
        }
        s
    }
}

fn target_name(t: Target) -> String {
    match t {
        Target::Node(n) => n.to_string(),
        Target::Any => "any".into(),
    }
}

/// Runs every probe on every probe node under both schedulers, then the Pods that fit nowhere
/// unpinned, and compares.
pub async fn run(client: &Client) -> anyhow::Result<ProbeReport> {
    let start = Instant::now();
    let seen = Seen::start(client);
    let probes = probes();
    check_independent(&probes)?;
    let nodes = nodes();
    // One worker per (scheduler, probe node), each running every probe on its node in turn,
    // starting at a different probe: no two copies of one scheduler on a node at once. Copies
    // of a probe whose selectors match its own labels (counted by each other across nodes)
    // take that probe's lock, per scheduler.
    let p = probes.len();
    let locks: HashMap<(&str, Impl), tokio::sync::Mutex<()>> = probes
        .iter()
        .filter(|pr| selectors(&pr.spec).iter().any(|s| matches(s, &pr.labels)))
        .flat_map(|pr| Impl::BOTH.map(|i| ((pr.name, i), tokio::sync::Mutex::new(()))))
        .collect();
    let workers = Impl::BOTH.into_iter().flat_map(|imp| {
        nodes.iter().enumerate().map({
            let (seen, probes, locks) = (&seen, &probes, &locks);
            move |(j, nd)| async move {
                let mut out = Vec::new();
                for k in 0..p {
                    let pr = &probes[(j + k) % p];
                    let _held = match locks.get(&(pr.name, imp)) {
                        Some(l) => Some(l.lock().await),
                        None => None,
                    };
                    let t = Target::Node(&nd.name);
                    out.push(((pr.name, t, imp), once(client, seen, pr, t, imp).await?));
                }
                anyhow::Ok(out)
            }
        })
    });
    let mut outcomes: BTreeMap<Key, Outcome> = BTreeMap::new();
    for w in futures::future::join_all(workers).await {
        outcomes.extend(w?);
    }
    let mut copies = outcomes.len();
    // Disagreements run again, one pair at a time.
    let mut reruns_agreed = Vec::new();
    let mut pending: Vec<(&Probe, Target)> = Vec::new();
    for pr in &probes {
        for nd in &nodes {
            let t = Target::Node(&nd.name);
            if outcomes[&(pr.name, t, Impl::Upstream)] != outcomes[&(pr.name, t, Impl::Kpr)] {
                pending.push((pr, t));
            }
        }
    }
    for (pr, t) in pending {
        let again = round(client, &seen, &[(pr, t)]).await?;
        copies += again.len();
        if again[&(pr.name, t, Impl::Upstream)] == again[&(pr.name, t, Impl::Kpr)] {
            reruns_agreed.push((pr.name.to_string(), target_name(t)));
        }
        outcomes.extend(again);
    }
    // Probes that fit on no probe node under either scheduler, unpinned, all at once (none is
    // ever assumed): their FitError messages over the whole cluster.
    let nowhere: Vec<(&Probe, Target)> = probes
        .iter()
        .filter(|pr| {
            nodes.iter().all(|nd| {
                Impl::BOTH
                    .iter()
                    .all(|i| outcomes[&(pr.name, Target::Node(&nd.name), *i)] != Outcome::Feasible)
            })
        })
        .map(|pr| (pr, Target::Any))
        .collect();
    if !nowhere.is_empty() {
        let got = round(client, &seen, &nowhere).await?;
        copies += got.len();
        outcomes.extend(got);
    }
    let mut feasible = BTreeMap::new();
    let mut differences = Vec::new();
    let mut nowhere_messages = BTreeMap::new();
    for pr in &probes {
        let mut sets = (BTreeSet::new(), BTreeSet::new());
        let mut targets: Vec<Target> = nodes.iter().map(|nd| Target::Node(&nd.name)).collect();
        targets.push(Target::Any);
        for t in targets {
            let (Some(u), Some(k)) = (
                outcomes.get(&(pr.name, t, Impl::Upstream)),
                outcomes.get(&(pr.name, t, Impl::Kpr)),
            ) else {
                continue;
            };
            if let Target::Node(nd) = t {
                if *u == Outcome::Feasible {
                    sets.0.insert(nd.to_string());
                }
                if *k == Outcome::Feasible {
                    sets.1.insert(nd.to_string());
                }
            } else if let Outcome::Unschedulable(m) = u {
                nowhere_messages.insert(pr.name, m.clone());
            }
            if u != k {
                differences.push((pr.name.to_string(), target_name(t), u.clone(), k.clone()));
            }
        }
        feasible.insert(pr.name, sets);
    }
    Ok(ProbeReport {
        feasible,
        differences,
        reruns_agreed,
        nowhere_messages,
        copies,
        elapsed: start.elapsed(),
    })
}
