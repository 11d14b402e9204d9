//! The control plane against the test API server: EndpointSlices and Endpoints follow Pods, slices
//! pack at 100 endpoints, LoadBalancer addresses are assigned, released and survive a restart, and
//! two managers elect one leader through a Lease.

use std::future::Future;
use std::time::{Duration, Instant};

use controllers::endpointslice::plan::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY};
use controllers::lbipam::{self, FINALIZER};
use controllers::leader::LeaderConfig;
use controllers::manager::{self, ControllerKind, ManagerConfig};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use test_apiserver::TestApiServer;
use tokio::task::JoinHandle;

const NS: &str = "shop";

/// Polls `check` until it returns Some or `timeout` passes.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn manager_cfg(kinds: &[ControllerKind]) -> ManagerConfig {
    ManagerConfig {
        controllers: kinds.to_vec(),
        lb_pool: None,
        leader: None,
        concurrency: 8,
    }
}

fn start(client: &Client, cfg: ManagerConfig) -> JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        if let Err(e) = manager::run(client, cfg).await {
            eprintln!("manager stopped: {e}");
        }
    })
}

async fn create_service(client: &Client, name: &str, extra: serde_json::Value) -> Service {
    let mut v = json!({
        "metadata": {"name": name, "labels": {"team": "shop"}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    });
    merge(&mut v, extra);
    let svc: Service = serde_json::from_value(v).unwrap();
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap()
}

fn merge(doc: &mut serde_json::Value, patch: serde_json::Value) {
    if let (Some(d), serde_json::Value::Object(p)) = (doc.as_object_mut(), patch) {
        for (k, v) in p {
            match d.get_mut(&k) {
                Some(cur) if cur.is_object() && v.is_object() => merge(cur, v),
                _ => {
                    d.insert(k, v);
                }
            }
        }
    }
}

fn pod_ip(i: usize) -> String {
    format!("10.244.{}.{}", i / 250, i % 250 + 1)
}

/// Creates a Pod and then, like a kubelet, writes its status: Running, podIP, Ready condition.
async fn create_pod(client: &Client, app: &str, i: usize, ready: bool) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{app}-{i}"), "labels": {"app": app}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &pod).await.unwrap();
    set_status(client, &created.name_any(), i, ready).await
}

async fn set_status(client: &Client, name: &str, i: usize, ready: bool) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let status = json!({"status": {"phase": "Running", "podIP": pod_ip(i), "podIPs": [{"ip": pod_ip(i)}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap()
}

async fn slices_of(client: &Client, svc: &str) -> Vec<EndpointSlice> {
    let lp = ListParams::default().labels(&format!("{LABEL_SERVICE_NAME}={svc}"));
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .unwrap()
        .items
}

/// (address, ready, serving, terminating) of every endpoint, sorted.
fn endpoint_states(slices: &[EndpointSlice]) -> Vec<(String, bool, bool, bool)> {
    let mut out: Vec<_> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            (
                e.addresses[0].clone(),
                c.ready.unwrap_or(false),
                c.serving.unwrap_or(false),
                c.terminating.unwrap_or(false),
            )
        })
        .collect();
    out.sort();
    out
}

fn ep_addresses(e: &Endpoints) -> (Vec<String>, Vec<String>) {
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    for s in e.subsets.iter().flatten() {
        ready.extend(s.addresses.iter().flatten().map(|a| a.ip.clone()));
        not_ready.extend(s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()));
    }
    ready.sort();
    not_ready.sort();
    (ready, not_ready)
}

async fn wait_states(
    client: &Client,
    svc: &str,
    want: Vec<(String, bool, bool, bool)>,
) -> Vec<EndpointSlice> {
    let what = format!("EndpointSlices of {svc} to be {want:?}");
    eventually(&what, Duration::from_secs(15), || async {
        let slices = slices_of(client, svc).await;
        (endpoint_states(&slices) == want).then_some(slices)
    })
    .await
}

async fn wait_endpoints(
    client: &Client,
    svc: &str,
    ready: Vec<String>,
    not_ready: Vec<String>,
) -> Endpoints {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let what = format!("Endpoints {svc} to be ready {ready:?} not ready {not_ready:?}");
    eventually(&what, Duration::from_secs(15), || async {
        let e = api.get_opt(svc).await.unwrap()?;
        (ep_addresses(&e) == (ready.clone(), not_ready.clone())).then_some(e)
    })
    .await
}

fn st(i: usize, ready: bool, serving: bool, terminating: bool) -> (String, bool, bool, bool) {
    (pod_ip(i), ready, serving, terminating)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_and_endpoints_follow_pods() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    let mgr = start(
        &client,
        manager_cfg(&[ControllerKind::EndpointSlice, ControllerKind::Endpoints]),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": "zone-a"}}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let svc = create_service(&client, "web", json!({})).await;
    for (i, ready) in [(0, true), (1, true), (2, false)] {
        create_pod(&client, "web", i, ready).await;
    }
    create_pod(&client, "other", 9, true).await;

    let slices = wait_states(
        &client,
        "web",
        vec![
            st(0, true, true, false),
            st(1, true, true, false),
            st(2, false, false, false),
        ],
    )
    .await;
    assert_eq!(slices.len(), 1);
    let s = &slices[0];
    assert_eq!(
        s.labels().get(LABEL_MANAGED_BY).map(String::as_str),
        Some(MANAGED_BY)
    );
    assert_eq!(s.labels().get("team").map(String::as_str), Some("shop"));
    let owner = &s.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid), owner.controller),
        ("Service", svc.uid().as_ref(), Some(true))
    );
    let port = &s.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port, port.protocol.as_deref()),
        (Some("http"), Some(8080), Some("TCP")),
        "named targetPort resolved"
    );
    assert_eq!(
        s.endpoints.as_ref().unwrap()[0].node_name.as_deref(),
        Some("node-1")
    );
    assert_eq!(
        s.endpoints.as_ref().unwrap()[0].zone.as_deref(),
        Some("zone-a"),
        "zone from the Node's label"
    );
    let ep = wait_endpoints(&client, "web", vec![pod_ip(0), pod_ip(1)], vec![pod_ip(2)]).await;
    assert_eq!(
        ep.subsets.as_ref().unwrap()[0].ports.as_ref().unwrap()[0].port,
        8080
    );
    assert_eq!(
        ep.labels().get("team").map(String::as_str),
        Some("shop"),
        "Endpoints carry the Service's labels"
    );

    // A Node moving zone updates its endpoints.
    let relabel = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}}});
    nodes
        .patch("node-1", &PatchParams::default(), &Patch::Merge(relabel))
        .await
        .unwrap();
    eventually(
        "endpoints to move to zone-b",
        Duration::from_secs(15),
        || async {
            let slices = slices_of(&client, "web").await;
            let zones: Vec<Option<String>> = slices
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .map(|e| e.zone.clone())
                .collect();
            (zones.len() == 3 && zones.iter().all(|z| z.as_deref() == Some("zone-b"))).then_some(())
        },
    )
    .await;

    // Readiness flips are followed.
    set_status(&client, "web-2", 2, true).await;
    wait_states(
        &client,
        "web",
        vec![
            st(0, true, true, false),
            st(1, true, true, false),
            st(2, true, true, false),
        ],
    )
    .await;

    // Deleting a Pod removes it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    wait_states(
        &client,
        "web",
        vec![st(1, true, true, false), st(2, true, true, false)],
    )
    .await;
    wait_endpoints(&client, "web", vec![pod_ip(1), pod_ip(2)], vec![]).await;

    // A Pod held by a finalizer is terminating: serving but not ready; gone from Endpoints.
    pods.patch(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["test/hold"]}})),
    )
    .await
    .unwrap();
    pods.delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_states(
        &client,
        "web",
        vec![st(1, false, true, true), st(2, true, true, false)],
    )
    .await;
    wait_endpoints(&client, "web", vec![pod_ip(2)], vec![]).await;

    // Deleting the Service removes its slices and Endpoints.
    Api::<Service>::namespaced(client.clone(), NS)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "slices and Endpoints of a deleted Service to go",
        Duration::from_secs(15),
        || async {
            let gone = slices_of(&client, "web").await.is_empty()
                && Api::<Endpoints>::namespaced(client.clone(), NS)
                    .get_opt("web")
                    .await
                    .unwrap()
                    .is_none();
            gone.then_some(())
        },
    )
    .await;
    mgr.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_to_250_pods_produces_three_slices() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    let mgr = start(&client, manager_cfg(&[ControllerKind::EndpointSlice]));
    create_service(&client, "big", json!({})).await;
    create_pod(&client, "big", 0, true).await;
    wait_states(&client, "big", vec![st(0, true, true, false)]).await;
    futures::stream::iter(1..250)
        .for_each_concurrent(16, |i| {
            let client = client.clone();
            async move {
                create_pod(&client, "big", i, true).await;
            }
        })
        .await;
    let slices = eventually(
        "250 endpoints in slices",
        Duration::from_secs(30),
        || async {
            let slices = slices_of(&client, "big").await;
            (endpoint_states(&slices).len() == 250 && endpoint_states(&slices).iter().all(|e| e.1))
                .then_some(slices)
        },
    )
    .await;
    let mut sizes: Vec<usize> = slices
        .iter()
        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
        .collect();
    sizes.sort_unstable();
    assert_eq!(
        sizes,
        [50, 100, 100],
        "at most 100 per slice, slices filled before new ones are made"
    );
    let mut addrs: Vec<String> = endpoint_states(&slices).into_iter().map(|e| e.0).collect();
    addrs.dedup();
    assert_eq!(addrs.len(), 250, "no endpoint appears twice");
    mgr.abort();
}

fn lb_cfg(pool: &str) -> ManagerConfig {
    ManagerConfig {
        lb_pool: Some(pool.parse().unwrap()),
        ..manager_cfg(&[ControllerKind::LbIpam])
    }
}

async fn lb_ip(client: &Client, name: &str) -> Option<String> {
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()?;
    lbipam::ingress_ips(&svc).first().map(ToString::to_string)
}

async fn wait_lb_ip(client: &Client, name: &str) -> String {
    eventually(
        &format!("an LB address for {name}"),
        Duration::from_secs(15),
        || lb_ip(client, name),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_ips_are_assigned_released_and_survive_restart() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    // A Service that already carries an address from before (as after a restart of everything).
    srv.insert(
        "services",
        json!({"metadata": {"name": "old", "namespace": NS, "finalizers": [FINALIZER]},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}),
    )
    .unwrap();
    let mgr = start(&client, lb_cfg("192.0.2.0/29"));
    let lb = json!({"spec": {"type": "LoadBalancer"}});
    create_service(&client, "a", lb.clone()).await;
    create_service(&client, "b", lb.clone()).await;
    create_service(&client, "plain", json!({})).await;
    let (a, b) = (
        wait_lb_ip(&client, "a").await,
        wait_lb_ip(&client, "b").await,
    );
    let pool: Vec<String> = (1..=6).map(|i| format!("192.0.2.{i}")).collect();
    assert!(
        pool.contains(&a) && pool.contains(&b),
        "{a} {b} from the pool"
    );
    assert!(
        a != b && a != "192.0.2.1" && b != "192.0.2.1",
        "no duplicates: old=192.0.2.1 a={a} b={b}"
    );
    assert_eq!(
        lb_ip(&client, "old").await.as_deref(),
        Some("192.0.2.1"),
        "existing assignment kept"
    );
    assert_eq!(lb_ip(&client, "plain").await, None);

    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
    // Deleting a LoadBalancer Service releases its address, then the finalizer lets it go.
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("Service a to be gone", Duration::from_secs(15), || async {
        svcs.get_opt("a").await.unwrap().is_none().then_some(())
    })
    .await;
    // Changing the type releases too.
    svcs.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
    )
    .await
    .unwrap();
    eventually(
        "b to lose its address and finalizer",
        Duration::from_secs(15),
        || async {
            let s = svcs.get("b").await.unwrap();
            (lbipam::ingress_ips(&s).is_empty() && !s.finalizers().contains(&FINALIZER.to_string()))
                .then_some(())
        },
    )
    .await;

    // Restart: the new allocator rebuilds from the Services and never hands out a held address.
    mgr.abort();
    create_service(&client, "c", lb.clone()).await;
    let mgr = start(&client, lb_cfg("192.0.2.0/29"));
    let c = wait_lb_ip(&client, "c").await;
    let mut held = vec!["192.0.2.1".to_string(), c.clone()];
    for name in ["d", "e", "f", "g"] {
        create_service(&client, name, lb.clone()).await;
        held.push(wait_lb_ip(&client, name).await);
    }
    let mut unique = held.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        held.len(),
        "all six addresses distinct: {held:?}"
    );
    // The pool (6 addresses) is now full: the next Service waits without an address.
    create_service(&client, "h", lb.clone()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lb_ip(&client, "h").await,
        None,
        "an exhausted pool assigns nothing"
    );
    svcs.delete("d", &DeleteParams::default()).await.unwrap();
    let h = wait_lb_ip(&client, "h").await;
    assert!(pool.contains(&h));
    mgr.abort();
}

async fn holder(client: &Client) -> Option<(String, i32)> {
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("kpr-test-leader")
        .await
        .unwrap()?;
    let spec = lease.spec?;
    Some((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    ))
}

fn leader_cfg(identity: &str) -> ManagerConfig {
    let leader = LeaderConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        ..LeaderConfig::new("kube-system", "kpr-test-leader", identity)
    };
    ManagerConfig {
        leader: Some(leader),
        ..manager_cfg(&[ControllerKind::EndpointSlice])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_with_two_managers() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    let a = start(&client, leader_cfg("manager-a"));
    eventually("manager-a to lead", Duration::from_secs(10), || async {
        holder(&client).await.filter(|h| h.0 == "manager-a")
    })
    .await;
    let b = start(&client, leader_cfg("manager-b"));
    create_service(&client, "one", json!({})).await;
    create_pod(&client, "one", 1, true).await;
    wait_states(&client, "one", vec![st(1, true, true, false)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        holder(&client).await.unwrap(),
        ("manager-a".to_string(), 0),
        "the leader keeps renewing; b waits"
    );

    // manager-a dies without releasing: b takes over once the lease expires and does the work.
    a.abort();
    let (who, transitions) = eventually(
        "manager-b to take over",
        Duration::from_secs(10),
        || async { holder(&client).await.filter(|h| h.0 == "manager-b") },
    )
    .await;
    assert_eq!((who.as_str(), transitions), ("manager-b", 1));
    create_service(&client, "two", json!({})).await;
    create_pod(&client, "two", 2, true).await;
    wait_states(&client, "two", vec![st(2, true, true, false)]).await;
    b.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_services_deleted_while_down_are_removed_at_start() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    let managed = json!({"kubernetes.io/service-name": "gone", LABEL_MANAGED_BY: MANAGED_BY});
    let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": "gone", "uid": "old-uid", "controller": true}]);
    srv.insert("endpointslices", json!({"metadata": {"name": "gone-abc", "namespace": NS, "labels": managed, "ownerReferences": owner},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.9.9.9"]}]}))
        .unwrap();
    let foreign = json!({"kubernetes.io/service-name": "gone", LABEL_MANAGED_BY: "someone-else"});
    srv.insert(
        "endpointslices",
        json!({"metadata": {"name": "gone-foreign", "namespace": NS, "labels": foreign},
        "addressType": "IPv4", "endpoints": []}),
    )
    .unwrap();
    srv.insert(
        "endpoints",
        json!({"metadata": {"name": "gone", "namespace": NS}, "subsets": []}),
    )
    .unwrap();
    let mgr = start(
        &client,
        manager_cfg(&[ControllerKind::EndpointSlice, ControllerKind::Endpoints]),
    );
    eventually(
        "the orphaned slice and Endpoints to be deleted",
        Duration::from_secs(15),
        || async {
            let slice_gone = srv.get("endpointslices", Some(NS), "gone-abc").is_err();
            let ep_gone = srv.get("endpoints", Some(NS), "gone").is_err();
            (slice_gone && ep_gone).then_some(())
        },
    )
    .await;
    assert!(
        srv.get("endpointslices", Some(NS), "gone-foreign").is_ok(),
        "slices of other managers are left alone"
    );
    mgr.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_written_without_zones_when_nodes_are_forbidden() {
    let srv = TestApiServer::start().await.unwrap();
    srv.faults().forbid("nodes");
    let client = srv.client().unwrap();
    let mgr = start(&client, manager_cfg(&[ControllerKind::EndpointSlice]));
    create_service(&client, "norbac", json!({})).await;
    create_pod(&client, "norbac", 3, true).await;
    let slices = wait_states(&client, "norbac", vec![st(3, true, true, false)]).await;
    assert_eq!(slices[0].endpoints.as_ref().unwrap()[0].zone, None);
    mgr.abort();
}
