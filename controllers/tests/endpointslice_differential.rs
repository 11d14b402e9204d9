//! Differential test of the EndpointSlice controller against kube-controller-manager's own, on the
//! real kube-apiserver of the pinned release: the same Services and Pods, the slices of both
//! compared after normalisation.
//!
//! # Why one control plane, both controllers at once, in one namespace
//!
//! Each controller only reads and writes the slices carrying its own
//! `endpointslice.kubernetes.io/managed-by` value: upstream lists a Service's slices with the
//! selector `kubernetes.io/service-name=<svc>,endpointslice.kubernetes.io/managed-by=
//! endpointslice-controller.k8s.io` (pkg/controller/endpointslice, `syncService`); ours, given
//! another value for this test (`plan::set_managed_by`: in production it writes upstream's, as it
//! replaces that controller), watches only slices labelled `endpointslice-controller.kpr.io` (`plan::is_managed`
//! filters again before planning, the orphan sweep and the cleanup of deleted Services). Neither
//! touches the other's slices, so both run side by side against the very same objects: one API
//! server, one set of Pods, and every slice of the namespace is attributed to its controller by
//! that label. (Were the values equal, the two would fight over the slices and this design would
//! be unsound; then they would have to run one after the other.)
//!
//! kube-controller-manager runs with `--controllers=endpointslice` only (default
//! `--max-endpoints-per-slice=100`, like `plan::MAX_ENDPOINTS_PER_SLICE`); ours runs in process
//! through `controllers::manager::run`.
//!
//! # How the objects are made
//!
//! Nodes first (two with a `topology.kubernetes.io/zone` label, one without), then every Pod with
//! its status written as a kubelet would (phase, `podIP`, `podIPs`, `Ready` condition), the
//! terminating ones deleted while a finalizer holds them, and only then the Services. Both
//! controllers thus see each Service with all of its Pods at once, which makes the packing of the
//! 250-Pod case deterministic for both (three slices of 100, 100 and 50 when planned in one go);
//! Pods trickling in would make upstream's packing depend on its sync timing.
//!
//! A second phase then changes existing objects (a Pod becomes ready, a Pod goes away leaving only
//! terminal ones, a Service's labels, `trafficDistribution` and `publishNotReadyAddresses` change)
//! and compares again once both controllers have shown something new for each changed Service. The
//! 250-Pod Service is not churned: there the packing after changes differs by design (ours fills
//! unchanged slices with room first, upstream only when all new endpoints fit; see plan.rs).
//!
//! # What is compared
//!
//! Per Service, and per group of slices with the same address type, ports (name, port, protocol,
//! appProtocol; order ignored), labels and owner references (kind, apiVersion, name, controller,
//! blockOwnerDeletion): the sorted list of endpoint counts per slice (the packing) and the set of
//! endpoints of the group (addresses, conditions ready/serving/terminating, nodeName, zone,
//! hostname, hints, targetRef kind/namespace/name). Which endpoint lands in which slice of a group
//! is not compared: upstream fills slices with `PopAny` from a map, an arbitrary order. Ignored
//! as well: names (`generateName` suffixes), uids (the targetRef's and the owner's uid are the
//! same objects' on both sides anyway), resourceVersions, generations, timestamps, annotations
//! (upstream writes `endpoints.kubernetes.io/last-change-trigger-time`, a timestamp) and endpoint
//! order. An absent list and an empty one are the same (`ports` of a placeholder slice).
//!
//! # Differences that are expected
//!
//! * `endpointslice.kubernetes.io/managed-by`: each controller writes its own value (see above);
//!   the label is removed before comparing, and checked separately to be the expected one.
//!
//! A Pod whose `spec.nodeName` names no existing Node (case `nonode`) is left out by both (unless
//! the Service has `publishNotReadyAddresses`, case `nonodepub`): a guard against Pods that
//! outlive their Node until the pod garbage collector removes them. Ours does so only once its
//! Node cache is synced; when Nodes may not be read it keeps every Pod, without a zone.
//!
//! Everything else must be equal (`EXPECTED_DIFFERENCES` lists the exceptions; a listed Service
//! that turns out equal fails the test, so the list cannot go stale). Found and fixed in
//! `controllers/src/endpointslice/plan.rs` while writing this test: named target ports on sidecars
//! (restartable init containers) did not resolve (case `sidecar`), and `trafficDistribution` zone
//! and node hints were not written (cases `prefer`, `samenode`), and Pods on missing Nodes were kept (case `nonode`).
//!
//! Convergence: both sides are read until three reads a second apart are equal and every Service
//! with a selector has slices on both sides (bounded by `CONVERGE`; no timing is asserted).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use controllers::manager::{self, ManagerConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

const UPSTREAM: &str = "endpointslice-controller.k8s.io";
/// Ours runs with another value (`plan::set_managed_by`, the binary's
/// `--endpointslice-managed-by`), so that both controllers run side by side.
const OURS: &str = "endpointslice-controller.kpr.io";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// How long both controllers get to settle.
const CONVERGE: Duration = Duration::from_secs(180);
/// A finalizer holding terminating Pods (nothing removes it: the control plane is thrown away).
const HOLD: &str = "kpr.io/differential-hold";

/// Services whose slices differ from upstream's, with the reason (see the module doc).
const EXPECTED_DIFFERENCES: &[(&str, &str)] = &[];

/// How a Pod's status is written.
#[derive(Clone, Copy, PartialEq)]
enum St {
    Ready,
    NotReady,
    /// No status written at all: no IP.
    Pending,
    Succeeded,
    Failed,
    /// Ready, then deleted while a finalizer holds it.
    TerminatingReady,
    /// Not ready, then deleted while a finalizer holds it.
    TerminatingNotReady,
}

/// One Pod of a case.
struct PodSpec {
    name: String,
    node: &'static str,
    st: St,
    /// Container ports: (name, port, protocol).
    ports: Vec<(&'static str, i32, &'static str)>,
    /// Ports of a restartable init container (a sidecar).
    sidecar_ports: Vec<(&'static str, i32, &'static str)>,
    hostname: Option<&'static str>,
    subdomain: Option<&'static str>,
    /// `podIPs` to write instead of the generated IPv4 address.
    ips: Vec<&'static str>,
}

fn pod(name: impl Into<String>, node: &'static str, st: St) -> PodSpec {
    PodSpec {
        name: name.into(),
        node,
        st,
        ports: vec![("http", 8080, "TCP")],
        sidecar_ports: Vec::new(),
        hostname: None,
        subdomain: None,
        ips: Vec::new(),
    }
}

impl PodSpec {
    fn ports(mut self, p: Vec<(&'static str, i32, &'static str)>) -> Self {
        self.ports = p;
        self
    }
}

/// One case: a Service (its spec, the selector `app=<name>` added unless `selector` is false) and
/// its Pods.
struct Case {
    name: &'static str,
    spec: Value,
    selector: bool,
    pods: Vec<PodSpec>,
}

fn case(name: &'static str, spec: Value, pods: Vec<PodSpec>) -> Case {
    Case {
        name,
        spec,
        selector: true,
        pods,
    }
}

fn http_port() -> Value {
    json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}])
}

fn cases() -> Vec<Case> {
    use St::*;
    let mut v = Vec::new();
    // (1) Named target ports resolving to different numbers per Pod: one slice per port set; a Pod
    // without the named port gets a slice with no ports.
    v.push(case(
        "named",
        json!({"ports": [{"name": "http", "port": 80, "targetPort": "http"},
                          {"name": "metrics", "port": 9100, "targetPort": "metrics", "appProtocol": "http"}]}),
        vec![
            pod("named-0", "node-a", Ready).ports(vec![("http", 8080, "TCP"), ("metrics", 9100, "TCP")]),
            pod("named-1", "node-b", Ready).ports(vec![("http", 8080, "TCP"), ("metrics", 9100, "TCP")]),
            pod("named-2", "node-a", Ready).ports(vec![("http", 9090, "TCP"), ("metrics", 9100, "TCP")]),
            pod("named-3", "node-c", Ready).ports(vec![("http", 9090, "TCP")]),
            pod("named-4", "node-b", Ready).ports(vec![("web", 8000, "TCP")]),
            // Same name, other protocol: does not resolve the TCP port.
            pod("named-5", "node-a", Ready).ports(vec![("http", 7070, "UDP")]),
        ],
    ));
    // (2) Not-ready Pods, and one without an IP yet.
    v.push(case(
        "notready",
        json!({"ports": http_port()}),
        vec![
            pod("notready-0", "node-a", Ready),
            pod("notready-1", "node-b", NotReady),
            pod("notready-2", "node-c", NotReady),
            pod("notready-3", "node-a", Pending),
        ],
    ));
    // (3) Terminating Pods: kept, serving as their Ready condition says, never ready.
    v.push(case(
        "terminating",
        json!({"ports": http_port()}),
        vec![
            pod("terminating-0", "node-a", Ready),
            pod("terminating-1", "node-b", TerminatingReady),
            pod("terminating-2", "node-c", TerminatingNotReady),
        ],
    ));
    // (4) publishNotReadyAddresses: everything with an IP is ready.
    v.push(case(
        "publish",
        json!({"ports": http_port(), "publishNotReadyAddresses": true}),
        vec![
            pod("publish-0", "node-a", Ready),
            pod("publish-1", "node-b", NotReady),
            pod("publish-2", "node-c", TerminatingNotReady),
        ],
    ));
    // (5) 250 Pods: packing into slices of at most 100.
    v.push(case(
        "many",
        json!({"ports": http_port()}),
        (0..250)
            .map(|i| {
                let node = ["node-a", "node-b", "node-c"][i % 3];
                pod(
                    format!("many-{i}"),
                    node,
                    if i % 7 == 0 { NotReady } else { Ready },
                )
            })
            .collect(),
    ));
    // (6) TCP and UDP on the same Service, a named UDP target.
    v.push(case(
        "dual",
        json!({"ports": [{"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353},
                          {"name": "dns-udp", "port": 53, "protocol": "UDP", "targetPort": "dns"}]}),
        vec![
            pod("dual-0", "node-a", Ready).ports(vec![("dns", 5353, "UDP"), ("dnsalt", 5300, "TCP")]),
            pod("dual-1", "node-b", Ready).ports(vec![("dns", 5353, "UDP")]),
        ],
    ));
    // (7) No selector: no managed slices at all.
    v.push(Case {
        name: "noselector",
        spec: json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        selector: false,
        pods: vec![pod("noselector-0", "node-a", Ready)],
    });
    // (8) Terminal Pods are left out.
    v.push(case(
        "terminal",
        json!({"ports": http_port()}),
        vec![
            pod("terminal-0", "node-a", Ready),
            pod("terminal-1", "node-b", Succeeded),
            pod("terminal-2", "node-c", Failed),
        ],
    ));
    // (9) Only terminal Pods: the placeholder slice.
    v.push(case(
        "empty",
        json!({"ports": http_port()}),
        vec![pod("empty-0", "node-a", Succeeded)],
    ));
    // (10) Headless, hostname and subdomain (only Pods whose subdomain is the Service's name get
    // a hostname); no ports.
    v.push(case(
        "headless",
        json!({"clusterIP": "None"}),
        vec![
            PodSpec {
                hostname: Some("h0"),
                subdomain: Some("headless"),
                ..pod("headless-0", "node-a", Ready)
            },
            PodSpec {
                hostname: Some("h1"),
                subdomain: Some("elsewhere"),
                ..pod("headless-1", "node-b", Ready)
            },
            PodSpec {
                subdomain: Some("headless"),
                ..pod("headless-2", "node-c", Ready)
            },
        ],
    ));
    // (11) A named target port on a sidecar (restartable init container).
    v.push(case(
        "sidecar",
        json!({"ports": http_port()}),
        vec![
            PodSpec {
                sidecar_ports: vec![("http", 8443, "TCP")],
                ..pod("sidecar-0", "node-a", Ready).ports(vec![])
            },
            pod("sidecar-1", "node-b", Ready),
        ],
    ));
    // (12) A Pod on a Node that does not exist.
    v.push(case(
        "nonode",
        json!({"ports": http_port()}),
        vec![
            pod("nonode-0", "node-a", Ready),
            pod("nonode-1", "node-gone", Ready),
        ],
    ));
    // (12b) The same with publishNotReadyAddresses: the Pod is kept (without a zone).
    v.push(case(
        "nonodepub",
        json!({"ports": http_port(), "publishNotReadyAddresses": true}),
        vec![
            pod("nonodepub-0", "node-a", Ready),
            pod("nonodepub-1", "node-gone", NotReady),
        ],
    ));
    // (13) trafficDistribution: PreferClose (zone hints).
    v.push(case(
        "prefer",
        json!({"ports": http_port(), "trafficDistribution": "PreferClose"}),
        vec![
            pod("prefer-0", "node-a", Ready),
            pod("prefer-1", "node-b", Ready),
            pod("prefer-2", "node-c", Ready),
        ],
    ));
    // (15) An IPv4 Service (the cluster is single-stack) with a dual-stack Pod and an IPv6-only
    // Pod: only IPv4 addresses, the IPv6-only Pod left out.
    v.push(case(
        "families",
        json!({"ports": http_port()}),
        vec![
            pod("families-0", "node-a", Ready),
            PodSpec {
                ips: vec!["10.244.9.1", "fd00:10:244::9:1"],
                ..pod("families-1", "node-b", Ready)
            },
            PodSpec {
                ips: vec!["fd00:10:244::9:2"],
                ..pod("families-2", "node-c", Ready)
            },
        ],
    ));
    // (14) trafficDistribution: PreferSameNode (zone and node hints), with a not-ready Pod.
    v.push(case(
        "samenode",
        json!({"ports": http_port(), "trafficDistribution": "PreferSameNode"}),
        vec![
            pod("samenode-0", "node-a", Ready),
            pod("samenode-1", "node-c", Ready),
            pod("samenode-2", "node-b", NotReady),
        ],
    ));
    v
}

// --- making the objects -------------------------------------------------------------------------

async fn create_nodes(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, zone) in [
        ("node-a", Some("zone-a")),
        ("node-b", Some("zone-b")),
        ("node-c", None),
    ] {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some(z) = zone {
            labels["topology.kubernetes.io/zone"] = json!(z);
        }
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
}

fn container_ports(ports: &[(&str, i32, &str)]) -> Value {
    ports
        .iter()
        .map(|(n, p, proto)| json!({"name": n, "containerPort": p, "protocol": proto}))
        .collect()
}

async fn create_pod(client: &Client, ns: &str, app: &str, p: &PodSpec, ip: String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let terminating = matches!(p.st, St::TerminatingReady | St::TerminatingNotReady);
    let mut spec = json!({
        "nodeName": p.node,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "ports": container_ports(&p.ports)}],
    });
    if !p.sidecar_ports.is_empty() {
        spec["initContainers"] = json!([{"name": "sidecar", "image": "registry.k8s.io/pause:3.10",
                                         "restartPolicy": "Always",
                                         "ports": container_ports(&p.sidecar_ports)}]);
    }
    if let Some(h) = p.hostname {
        spec["hostname"] = json!(h);
    }
    if let Some(s) = p.subdomain {
        spec["subdomain"] = json!(s);
    }
    let mut meta = json!({"name": p.name, "labels": {"app": app}});
    if terminating {
        meta["finalizers"] = json!([HOLD]);
    }
    let obj: Pod = serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap();
    pods.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {}: {e}", p.name));
    if p.st == St::Pending {
        return;
    }
    let (phase, ready) = match p.st {
        St::Ready | St::TerminatingReady => ("Running", "True"),
        St::NotReady | St::TerminatingNotReady => ("Running", "False"),
        St::Succeeded => ("Succeeded", "False"),
        St::Failed => ("Failed", "False"),
        St::Pending => unreachable!(),
    };
    let ips: Vec<String> = if p.ips.is_empty() {
        vec![ip]
    } else {
        p.ips.iter().map(|s| s.to_string()).collect()
    };
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let status = json!({"status": {
        "phase": phase,
        "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
        "podIP": ips[0], "podIPs": pod_ips,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ],
    }});
    pods.patch_status(&p.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("writing the status of Pod {}: {e}", p.name));
    if terminating {
        pods.delete(&p.name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting Pod {}: {e}", p.name));
    }
}

async fn create_service(client: &Client, ns: &str, c: &Case) {
    let mut spec = c.spec.clone();
    if c.selector {
        spec["selector"] = json!({"app": c.name});
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": c.name, "labels": {"team": "differential", "case": c.name}},
        "spec": spec,
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("creating Service {}: {e}", c.name));
}

// --- normalising ---------------------------------------------------------------------------------

/// What makes slices of one Service interchangeable: everything but the endpoints.
type GroupKey = String;

/// One Service's slices on one side: per group, the sorted endpoint counts and the endpoints.
type Normalized = BTreeMap<GroupKey, (Vec<usize>, BTreeSet<String>)>;

/// Per controller (managed-by value), per Service name.
type Snapshot = BTreeMap<String, BTreeMap<String, Normalized>>;

fn endpoint_json(e: &Endpoint) -> String {
    let c = e.conditions.clone().unwrap_or_default();
    let target = e
        .target_ref
        .as_ref()
        .map(|t| json!({"kind": t.kind, "namespace": t.namespace, "name": t.name}));
    let hints = e.hints.as_ref().map(|h| {
        json!({
            "forZones": h.for_zones.iter().flatten().map(|z| z.name.clone()).collect::<Vec<_>>(),
            "forNodes": h.for_nodes.iter().flatten().map(|n| n.name.clone()).collect::<Vec<_>>(),
        })
    });
    let mut addresses = e.addresses.clone();
    addresses.sort();
    json!({
        "addresses": addresses,
        "conditions": {"ready": c.ready, "serving": c.serving, "terminating": c.terminating},
        "nodeName": e.node_name, "zone": e.zone, "hostname": e.hostname,
        "hints": hints, "targetRef": target,
    })
    .to_string()
}

fn group_key(s: &EndpointSlice) -> GroupKey {
    let mut ports: Vec<String> = s
        .ports
        .iter()
        .flatten()
        .map(|p| {
            json!({"name": p.name, "port": p.port, "protocol": p.protocol, "appProtocol": p.app_protocol})
                .to_string()
        })
        .collect();
    ports.sort();
    let mut labels = s.labels().clone();
    labels.remove(MANAGED_BY);
    let mut owners: Vec<String> = s
        .owner_references()
        .iter()
        .map(|o| {
            json!({"apiVersion": o.api_version, "kind": o.kind, "name": o.name,
                   "controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion})
            .to_string()
        })
        .collect();
    owners.sort();
    json!({"addressType": s.address_type, "ports": ports, "labels": labels, "owners": owners})
        .to_string()
}

fn normalize(slices: &[EndpointSlice]) -> Snapshot {
    let mut out = Snapshot::new();
    for s in slices {
        let by = s.labels().get(MANAGED_BY).cloned().unwrap_or_default();
        let svc = s.labels().get(SERVICE_NAME).cloned().unwrap_or_default();
        let group = out
            .entry(by)
            .or_default()
            .entry(svc)
            .or_default()
            .entry(group_key(s))
            .or_default();
        let eps = &s.endpoints[..];
        group.0.push(eps.len());
        group.0.sort_unstable();
        for e in eps {
            assert!(
                group.1.insert(endpoint_json(e)),
                "endpoint {} twice in the slices of {}",
                endpoint_json(e),
                s.name_any()
            );
        }
    }
    out
}

async fn snapshot(client: &Client, ns: &str) -> Snapshot {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("listing EndpointSlices");
    normalize(&slices.items)
}

/// Reads until three reads a second apart agree, every Service with a selector has slices from
/// both controllers, and, after a change, both controllers show something new for every Service in
/// `changed` (compared with `before`).
async fn converge(
    client: &Client,
    ns: &str,
    with_selector: &[&str],
    before: Option<&Snapshot>,
    changed: &[&str],
) -> Snapshot {
    let deadline = Instant::now() + CONVERGE;
    let mut stable: Vec<Snapshot> = Vec::new();
    loop {
        let snap = snapshot(client, ns).await;
        let complete = [UPSTREAM, OURS].iter().all(|by| {
            with_selector
                .iter()
                .all(|svc| snap.get(*by).is_some_and(|m| m.contains_key(*svc)))
                && changed.iter().all(|svc| {
                    let old = before.and_then(|b| b.get(*by)).and_then(|m| m.get(*svc));
                    snap.get(*by).and_then(|m| m.get(*svc)) != old
                })
        });
        if !complete || stable.last() != Some(&snap) {
            stable.clear();
        }
        if complete {
            stable.push(snap.clone());
            if stable.len() == 3 {
                return snap;
            }
        }
        if Instant::now() > deadline {
            panic!(
                "EndpointSlices did not settle within {CONVERGE:?}; last read:\n{}",
                serde_json::to_string_pretty(&snap).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The differences between both sides of `snap`, one message per Service not listed in
/// `EXPECTED_DIFFERENCES`.
fn compare(cases: &[Case], snap: &Snapshot, phase: &str) -> Vec<String> {
    let empty = BTreeMap::new();
    let upstream = snap.get(UPSTREAM).unwrap_or(&empty);
    let mine = snap.get(OURS).unwrap_or(&empty);
    let unknown: Vec<&String> = snap
        .keys()
        .filter(|k| *k != UPSTREAM && *k != OURS)
        .collect();
    assert!(
        unknown.is_empty(),
        "slices managed by someone else: {unknown:?}"
    );

    let mut failures = Vec::new();
    for c in cases {
        let (u, o) = (upstream.get(c.name), mine.get(c.name));
        if !c.selector {
            assert!(u.is_none(), "upstream made slices for {}", c.name);
            assert!(o.is_none(), "we made slices for {}", c.name);
            continue;
        }
        let expected = EXPECTED_DIFFERENCES.iter().find(|(n, _)| *n == c.name);
        if u == o {
            assert!(
                expected.is_none(),
                "{}: listed as an expected difference but equal: update EXPECTED_DIFFERENCES",
                c.name
            );
            continue;
        }
        if let Some((_, why)) = expected {
            eprintln!("{phase}: {}: differs as expected: {why}", c.name);
            continue;
        }
        failures.push(format!(
            "{phase}: Service {}:\n  kube-controller-manager: {}\n  ours:                    {}",
            c.name,
            serde_json::to_string_pretty(&u).unwrap(),
            serde_json::to_string_pretty(&o).unwrap()
        ));
    }
    // The packing of the big case, spelled out (equality above already covers it).
    let packing = |side: &BTreeMap<String, Normalized>| -> Vec<usize> {
        side.get("many")
            .map(|g| g.values().flat_map(|(counts, _)| counts.clone()).collect())
            .unwrap_or_default()
    };
    eprintln!(
        "{phase}: packing of 250 endpoints: upstream {:?}, ours {:?}",
        packing(upstream),
        packing(mine)
    );
    failures
}

// --- the test ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointslices_match_kube_controller_manager() {
    let started = Instant::now();
    let cp = tokio::task::spawn_blocking(|| {
        let mut cp = controlplane::ControlPlane::start(controlplane::Options::minimal(
            controlplane::run_dir("es-differential"),
        ))
        .expect("starting the reference control plane");
        cp.start_upstream_controller_manager("endpointslice")
            .expect("starting kube-controller-manager");
        cp
    })
    .await
    .unwrap();
    let ns = cp.test_namespace("differential").unwrap();
    let client = cp.client().await.unwrap();
    controllers::endpoint::endpointslice::plan::set_managed_by(OURS).unwrap();
    let ours = {
        let client = client.clone();
        tokio::spawn(async move {
            let cfg = ManagerConfig {
                controllers: manager::parse_controllers("endpointslice").unwrap(),
                lb_pool: None,
                root_ca_file: None,
                service_account_private_key_file: None,
                signing: Default::default(),
                leader: None,
                concurrency: controllers::manager::Concurrency {
                    endpoints: 8,
                    ..Default::default()
                },
            };
            if let Err(e) = manager::run(client, cfg).await {
                eprintln!("our controller manager stopped: {e}");
            }
        })
    };

    create_nodes(&client).await;
    let cases = cases();
    let mut all_pods = Vec::new();
    for c in &cases {
        for p in &c.pods {
            all_pods.push((c.name, p));
        }
    }
    futures::stream::iter(all_pods.into_iter().enumerate())
        .for_each_concurrent(16, |(i, (app, p))| {
            let (client, ns) = (client.clone(), ns.clone());
            async move {
                let ip = format!("10.244.{}.{}", i / 200, i % 200 + 1);
                create_pod(&client, &ns, app, p, ip).await;
            }
        })
        .await;
    // Selector-less first: by the time the others settle, it has long been seen.
    for c in cases.iter().filter(|c| !c.selector) {
        create_service(&client, &ns, c).await;
    }
    for c in cases.iter().filter(|c| c.selector) {
        create_service(&client, &ns, c).await;
    }
    let with_selector: Vec<&str> = cases
        .iter()
        .filter(|c| c.selector)
        .map(|c| c.name)
        .collect();
    let snap = converge(&client, &ns, &with_selector, None, &[]).await;
    eprintln!("converged after {:?}", started.elapsed());

    let failures = compare(&cases, &snap, "after creation");

    // Phase 2: changes to existing Services and Pods (update paths: conditions, labels, hints,
    // the placeholder). The 250-Pod Service is left alone: after churn, packing legitimately
    // differs (ours fills unchanged slices first, see plan.rs).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let merge = |v: Value| Patch::Merge(v);
    pods.patch_status(
        "notready-1",
        &PatchParams::default(),
        &merge(
            json!({"status": {"conditions": [{"type": "ContainersReady", "status": "True"},
                                                 {"type": "Ready", "status": "True"}]}}),
        ),
    )
    .await
    .unwrap();
    pods.delete("terminal-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    services
        .patch(
            "named",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"tier": "front", "case": null}}})),
        )
        .await
        .unwrap();
    services
        .patch(
            "prefer",
            &PatchParams::default(),
            &merge(json!({"spec": {"trafficDistribution": null}})),
        )
        .await
        .unwrap();
    services
        .patch(
            "publish",
            &PatchParams::default(),
            &merge(json!({"spec": {"publishNotReadyAddresses": false}})),
        )
        .await
        .unwrap();
    let changed = ["notready", "terminal", "named", "prefer", "publish"];
    let snap2 = converge(&client, &ns, &with_selector, Some(&snap), &changed).await;
    eprintln!("converged again after {:?}", started.elapsed());
    let mut failures = failures;
    failures.extend(compare(&cases, &snap2, "after changes"));

    ours.abort();
    drop(cp);
    eprintln!("total {:?}", started.elapsed());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
