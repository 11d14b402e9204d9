//! The controllers (in-process managers) against the reference kube-apiserver (etcd behind it,
//! TLS, RBAC; no kube-controller-manager): EndpointSlices and Endpoints follow Pods, slices pack at
//! 100 endpoints, LoadBalancer addresses are assigned, released and survive a restart of the
//! manager, two managers elect one leader through a Lease, leftovers of Services deleted while no
//! manager ran are removed at start, and a manager whose user RBAC denies Nodes writes slices
//! without zones.
//!
//! Every test shares the binary's control plane and works in its own namespace; every assertion is
//! about that namespace. Cluster-scoped names (Nodes, ClusterRoles, users, leader Leases in
//! kube-system) carry the namespace's name so parallel tests cannot clash.
//!
//! The controllers watch all namespaces, and two EndpointSlice/Endpoints controllers writing the
//! same Services would fight (in production leader election keeps one): the tests that run those
//! controllers take [`MANAGERS`] for their whole run, so one such manager runs at a time. The
//! LoadBalancer test runs only lb-ipam and is the only test that creates LoadBalancer Services,
//! so it runs beside the others; its pool (192.0.2.0/29) is its own.
//!
//! This suite acts as the kubelet: it writes Pod status (Running, podIP, Ready) and deletes Pods
//! with a grace period of 0 (a Pod bound to a node is otherwise only marked terminating and waits
//! for a kubelet that never comes). Nothing collects garbage or deletes namespaces: what a test
//! leaves behind stays, and later managers reconcile it too (it is already in step).
//!
//! What the real server requires of the fixtures: Pods need a container image and are deleted
//! gracefully once bound to a node (so "deleted" means grace period 0, "terminating" means an
//! ordinary delete); leftovers are made by a manager that really wrote them and was stopped;
//! kube-apiserver deletes a Service's Endpoints together with the Service, so a leftover Endpoints
//! object is written by hand; status (a LoadBalancer address from before) is written through the
//! status subresource; the "Nodes forbidden" case is the real RBAC authorizer's 403.

use std::future::Future;
use std::time::Duration;

mod common;

use controllers::endpoint::endpointslice::plan::{
    LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY,
};
use controllers::endpoint::lbipam::{self, FINALIZER};
use controllers::manager::{self, ManagerConfig};
use controllers::runtime::leader::LeaderConfig;
use controlplane::ControlPlane;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

/// How long any one expected state may take to appear.
const WAIT: Duration = Duration::from_secs(60);

/// Held by every test that runs an EndpointSlice or Endpoints controller, for its whole run.
static MANAGERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `check` until it returns Some or `timeout` passes.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    common::wait::eventually(what, timeout, Duration::from_millis(100), |m| m, check).await
}

/// One test's view of the shared control plane: its namespace and an admin client.
struct Fixture {
    cp: &'static ControlPlane,
    ns: String,
    client: Client,
}

impl Fixture {
    async fn new(tag: &str) -> Fixture {
        // The managers run in this process: their log goes to the test's captured output, shown
        // when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
        let cp = controlplane::shared().unwrap();
        let ns = cp.test_namespace(tag).unwrap();
        let client = cp.client().await.unwrap();
        Fixture { cp, ns, client }
    }

    /// A cluster-scoped name that no other test uses.
    fn unique(&self, what: &str) -> String {
        format!("{}-{what}", self.ns)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// A manager task, aborted when dropped (so a failing test stops its manager before the lock goes).
struct Manager(JoinHandle<()>);

impl Drop for Manager {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn manager_cfg(names: &str) -> ManagerConfig {
    ManagerConfig {
        controllers: manager::parse_controllers(names).unwrap(),
        lb_pool: None,
        root_ca_file: None,
        service_account_private_key_file: None,
        signing: Default::default(),
        leader: None,
        concurrency: controllers::manager::Concurrency {
            endpoints: 8,
            ..Default::default()
        },
    }
}

fn start(client: &Client, cfg: ManagerConfig) -> Manager {
    let client = client.clone();
    Manager(tokio::spawn(async move {
        if let Err(e) = manager::run(client, cfg).await {
            eprintln!("manager stopped: {e}");
        }
    }))
}

async fn create_service(f: &Fixture, name: &str, extra: serde_json::Value) -> Service {
    let mut v = json!({
        "metadata": {"name": name, "labels": {"team": "shop"}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    });
    merge(&mut v, extra);
    let svc: Service = serde_json::from_value(v).unwrap();
    f.api::<Service>()
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

/// Creates a Pod bound to `node` and then, like a kubelet, writes its status: Running, podIP,
/// Ready condition.
async fn create_pod(f: &Fixture, node: &str, app: &str, i: usize, ready: bool) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{app}-{i}"), "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/app:1", "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    let created = f
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    set_status(f, &created.name_any(), i, ready).await
}

async fn set_status(f: &Fixture, name: &str, i: usize, ready: bool) -> Pod {
    let status = json!({"status": {"phase": "Running", "podIP": pod_ip(i), "podIPs": [{"ip": pod_ip(i)}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    f.api::<Pod>()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap()
}

/// Deletes a Pod as its kubelet confirms the deletion: at once (grace period 0).
async fn delete_pod_now(f: &Fixture, name: &str) {
    f.api::<Pod>()
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

async fn create_node(f: &Fixture, name: &str, zone: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name,
        "labels": {"topology.kubernetes.io/zone": zone}}}))
    .unwrap();
    Api::<Node>::all(f.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

async fn slices_of(client: &Client, ns: &str, svc: &str) -> Vec<EndpointSlice> {
    let lp = ListParams::default().labels(&format!("{LABEL_SERVICE_NAME}={svc}"));
    Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
}

/// (address, ready, serving, terminating) of every endpoint, sorted.
fn endpoint_states(slices: &[EndpointSlice]) -> Vec<(String, bool, bool, bool)> {
    let mut out: Vec<_> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
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
    f: &Fixture,
    svc: &str,
    want: Vec<(String, bool, bool, bool)>,
) -> Vec<EndpointSlice> {
    let what = format!("EndpointSlices of {}/{svc} to be {want:?}", f.ns);
    eventually(&what, WAIT, || async {
        let slices = slices_of(&f.client, &f.ns, svc).await;
        (endpoint_states(&slices) == want).then_some(slices)
    })
    .await
}

async fn wait_endpoints(
    f: &Fixture,
    svc: &str,
    ready: Vec<String>,
    not_ready: Vec<String>,
) -> Endpoints {
    let api: Api<Endpoints> = f.api();
    let what = format!(
        "Endpoints {}/{svc} to be ready {ready:?} not ready {not_ready:?}",
        f.ns
    );
    eventually(&what, WAIT, || async {
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
    let f = Fixture::new("follow").await;
    let _one = MANAGERS.lock().await;
    let node = f.unique("node");
    create_node(&f, &node, "zone-a").await;
    let _mgr = start(&f.client, manager_cfg("endpointslice,endpoints"));
    let svc = create_service(&f, "web", json!({})).await;
    for (i, ready) in [(0, true), (1, true), (2, false)] {
        create_pod(&f, &node, "web", i, ready).await;
    }
    create_pod(&f, &node, "other", 9, true).await;

    let slices = wait_states(
        &f,
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
    assert_eq!(s.endpoints[0].node_name.as_deref(), Some(node.as_str()));
    assert_eq!(
        s.endpoints[0].zone.as_deref(),
        Some("zone-a"),
        "zone from the Node's label"
    );
    let ep = wait_endpoints(&f, "web", vec![pod_ip(0), pod_ip(1)], vec![pod_ip(2)]).await;
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
    Api::<Node>::all(f.client.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(relabel))
        .await
        .unwrap();
    eventually("endpoints to move to zone-b", WAIT, || async {
        let slices = slices_of(&f.client, &f.ns, "web").await;
        let zones: Vec<Option<String>> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .map(|e| e.zone.clone())
            .collect();
        (zones.len() == 3 && zones.iter().all(|z| z.as_deref() == Some("zone-b"))).then_some(())
    })
    .await;

    // Readiness flips are followed.
    set_status(&f, "web-2", 2, true).await;
    wait_states(
        &f,
        "web",
        vec![
            st(0, true, true, false),
            st(1, true, true, false),
            st(2, true, true, false),
        ],
    )
    .await;

    // Deleting a Pod removes it.
    delete_pod_now(&f, "web-0").await;
    wait_states(
        &f,
        "web",
        vec![st(1, true, true, false), st(2, true, true, false)],
    )
    .await;
    wait_endpoints(&f, "web", vec![pod_ip(1), pod_ip(2)], vec![]).await;

    // A Pod being deleted (its grace period running, and a finalizer holding it beyond) is
    // terminating: serving but not ready; gone from Endpoints.
    let pods: Api<Pod> = f.api();
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
        &f,
        "web",
        vec![st(1, false, true, true), st(2, true, true, false)],
    )
    .await;
    wait_endpoints(&f, "web", vec![pod_ip(2)], vec![]).await;

    // Deleting the Service removes its slices and Endpoints (no garbage collector runs: the
    // controllers do it).
    f.api::<Service>()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "slices and Endpoints of a deleted Service to go",
        WAIT,
        || async {
            let gone = slices_of(&f.client, &f.ns, "web").await.is_empty()
                && f.api::<Endpoints>().get_opt("web").await.unwrap().is_none();
            gone.then_some(())
        },
    )
    .await;
    // The held Pod would wait for its finalizer forever: let it go.
    pods.patch(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_to_250_pods_produces_three_slices() {
    let f = Fixture::new("scale").await;
    let _one = MANAGERS.lock().await;
    let node = f.unique("node");
    create_node(&f, &node, "zone-a").await;
    let _mgr = start(&f.client, manager_cfg("endpointslice"));
    create_service(&f, "big", json!({})).await;
    create_pod(&f, &node, "big", 0, true).await;
    wait_states(&f, "big", vec![st(0, true, true, false)]).await;
    futures::stream::iter(1..250)
        .for_each_concurrent(16, |i| {
            let f = &f;
            let node = &node;
            async move {
                create_pod(f, node, "big", i, true).await;
            }
        })
        .await;
    let slices = eventually(
        "250 endpoints in slices",
        Duration::from_secs(120),
        || async {
            let slices = slices_of(&f.client, &f.ns, "big").await;
            (endpoint_states(&slices).len() == 250 && endpoint_states(&slices).iter().all(|e| e.1))
                .then_some(slices)
        },
    )
    .await;
    let mut sizes: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
    sizes.sort_unstable();
    assert_eq!(
        sizes,
        [50, 100, 100],
        "at most 100 per slice, slices filled before new ones are made"
    );
    let mut addrs: Vec<String> = endpoint_states(&slices).into_iter().map(|e| e.0).collect();
    addrs.dedup();
    assert_eq!(addrs.len(), 250, "no endpoint appears twice");
}

fn lb_cfg(pool: &str) -> ManagerConfig {
    ManagerConfig {
        lb_pool: Some(pool.parse().unwrap()),
        root_ca_file: None,
        service_account_private_key_file: None,
        signing: Default::default(),
        ..manager_cfg("lb-ipam")
    }
}

async fn lb_ip(f: &Fixture, name: &str) -> Option<String> {
    let svc = f.api::<Service>().get_opt(name).await.unwrap()?;
    lbipam::ingress_ips(&svc).first().map(ToString::to_string)
}

async fn wait_lb_ip(f: &Fixture, name: &str) -> String {
    eventually(&format!("an LB address for {name}"), WAIT, || {
        lb_ip(f, name)
    })
    .await
}

/// lb-ipam only (no slices written), so it runs beside the other tests without [`MANAGERS`]: it
/// is the only test of this binary creating LoadBalancer Services, which lb-ipam sees in every
/// namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_ips_are_assigned_released_and_survive_restart() {
    let f = Fixture::new("lb-ipam").await;
    // A Service that already carries an address from before (as after a restart of everything):
    // created with the finalizer, its status written as an earlier allocator did.
    let lb = json!({"spec": {"type": "LoadBalancer"}});
    let old = json!({"metadata": {"finalizers": [FINALIZER]}, "spec": {"type": "LoadBalancer"}});
    create_service(&f, "old", old).await;
    f.api::<Service>()
        .patch_status(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})),
        )
        .await
        .unwrap();
    let mgr = start(&f.client, lb_cfg("192.0.2.0/29"));
    create_service(&f, "a", lb.clone()).await;
    create_service(&f, "b", lb.clone()).await;
    create_service(&f, "plain", json!({})).await;
    let (a, b) = (wait_lb_ip(&f, "a").await, wait_lb_ip(&f, "b").await);
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
        lb_ip(&f, "old").await.as_deref(),
        Some("192.0.2.1"),
        "existing assignment kept"
    );
    assert_eq!(lb_ip(&f, "plain").await, None);

    let svcs: Api<Service> = f.api();
    // Deleting a LoadBalancer Service releases its address, then the finalizer lets it go.
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("Service a to be gone", WAIT, || async {
        svcs.get_opt("a").await.unwrap().is_none().then_some(())
    })
    .await;
    // Changing the type releases too (the API server drops the node ports itself).
    svcs.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
    )
    .await
    .unwrap();
    eventually("b to lose its address and finalizer", WAIT, || async {
        let s = svcs.get("b").await.unwrap();
        (lbipam::ingress_ips(&s).is_empty() && !s.finalizers().contains(&FINALIZER.to_string()))
            .then_some(())
    })
    .await;

    // Restart of the manager (the API server stays up): the new allocator rebuilds from the
    // Services and never hands out a held address.
    drop(mgr);
    create_service(&f, "c", lb.clone()).await;
    let _mgr = start(&f.client, lb_cfg("192.0.2.0/29"));
    let c = wait_lb_ip(&f, "c").await;
    let mut held = vec!["192.0.2.1".to_string(), c.clone()];
    for name in ["d", "e", "f", "g"] {
        create_service(&f, name, lb.clone()).await;
        held.push(wait_lb_ip(&f, name).await);
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
    create_service(&f, "h", lb.clone()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lb_ip(&f, "h").await,
        None,
        "an exhausted pool assigns nothing"
    );
    svcs.delete("d", &DeleteParams::default()).await.unwrap();
    let h = wait_lb_ip(&f, "h").await;
    assert!(pool.contains(&h));
}

async fn holder(client: &Client, lease: &str) -> Option<(String, i32)> {
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt(lease)
        .await
        .unwrap()?;
    let spec = lease.spec?;
    Some((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    ))
}

fn leader_cfg(lease: &str, identity: &str) -> ManagerConfig {
    let leader = LeaderConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        ..LeaderConfig::new("kube-system", lease, identity)
    };
    ManagerConfig {
        leader: Some(leader),
        ..manager_cfg("endpointslice")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_with_two_managers() {
    let f = Fixture::new("leader").await;
    let _one = MANAGERS.lock().await;
    let node = f.unique("node");
    create_node(&f, &node, "zone-a").await;
    // A Lease of this test only (kube-system is shared by the whole binary).
    let lease = f.unique("leader");
    let a = start(&f.client, leader_cfg(&lease, "manager-a"));
    eventually("manager-a to lead", WAIT, || async {
        holder(&f.client, &lease)
            .await
            .filter(|h| h.0 == "manager-a")
    })
    .await;
    let b = start(&f.client, leader_cfg(&lease, "manager-b"));
    create_service(&f, "one", json!({})).await;
    create_pod(&f, &node, "one", 1, true).await;
    wait_states(&f, "one", vec![st(1, true, true, false)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        holder(&f.client, &lease).await.unwrap(),
        ("manager-a".to_string(), 0),
        "the leader keeps renewing; b waits"
    );

    // manager-a dies without releasing: b takes over once the lease expires and does the work.
    drop(a);
    let (who, transitions) = eventually("manager-b to take over", WAIT, || async {
        holder(&f.client, &lease)
            .await
            .filter(|h| h.0 == "manager-b")
    })
    .await;
    assert_eq!((who.as_str(), transitions), ("manager-b", 1));
    create_service(&f, "two", json!({})).await;
    create_pod(&f, &node, "two", 2, true).await;
    wait_states(&f, "two", vec![st(2, true, true, false)]).await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_services_deleted_while_down_are_removed_at_start() {
    let f = Fixture::new("leftovers").await;
    let _one = MANAGERS.lock().await;
    // A first manager writes the slices and Endpoints of a Service, then stops; the Service is
    // deleted while no manager runs (and no garbage collector either).
    let node = f.unique("node");
    create_node(&f, &node, "zone-a").await;
    let mgr = start(&f.client, manager_cfg("endpointslice,endpoints"));
    create_service(&f, "gone", json!({})).await;
    create_pod(&f, &node, "gone", 7, true).await;
    wait_states(&f, "gone", vec![st(7, true, true, false)]).await;
    wait_endpoints(&f, "gone", vec![pod_ip(7)], vec![]).await;
    drop(mgr);
    let managed = slices_of(&f.client, &f.ns, "gone").await;
    assert_eq!(managed.len(), 1);
    let managed = managed[0].name_any();
    f.api::<Service>()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // A slice of the same Service name written by someone else.
    let foreign = json!({"kubernetes.io/service-name": "gone", LABEL_MANAGED_BY: "someone-else"});
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "gone-foreign", "labels": foreign},
        "addressType": "IPv4", "endpoints": []}))
    .unwrap();
    f.api::<EndpointSlice>()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    // The API server deletes a Service's Endpoints with it (the Service storage does, for lack of
    // a guaranteed Endpoints controller); a leftover Endpoints object is still possible, written
    // by a controller racing the deletion: made here by hand.
    assert!(
        f.api::<Endpoints>()
            .get_opt("gone")
            .await
            .unwrap()
            .is_none(),
        "kube-apiserver deletes the Endpoints of a deleted Service"
    );
    let orphan: Endpoints = serde_json::from_value(json!({"metadata": {"name": "gone"},
        "subsets": [{"addresses": [{"ip": pod_ip(7)}], "ports": [{"name": "http", "port": 8080}]}]}))
    .unwrap();
    f.api::<Endpoints>()
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();

    // The restarted manager removes what the deleted Service left behind.
    let _mgr = start(&f.client, manager_cfg("endpointslice,endpoints"));
    eventually(
        "the orphaned slice and Endpoints to be deleted",
        WAIT,
        || async {
            let slice_gone = f
                .api::<EndpointSlice>()
                .get_opt(&managed)
                .await
                .unwrap()
                .is_none();
            let ep_gone = f
                .api::<Endpoints>()
                .get_opt("gone")
                .await
                .unwrap()
                .is_none();
            (slice_gone && ep_gone).then_some(())
        },
    )
    .await;
    assert!(
        f.api::<EndpointSlice>()
            .get_opt("gone-foreign")
            .await
            .unwrap()
            .is_some(),
        "slices of other managers are left alone"
    );
}

/// The manager runs as a user whose RBAC grants everything it writes and reads except Nodes (the
/// real authorizer answers 403 to its Node list and watch); the Node exists and has a zone, but
/// the endpoints carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_written_without_zones_when_nodes_are_forbidden() {
    let f = Fixture::new("no-nodes").await;
    let _one = MANAGERS.lock().await;
    let node = f.unique("node");
    create_node(&f, &node, "zone-a").await;
    let user = f.unique("manager");
    let role = f.unique("no-nodes");
    let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [
            {"apiGroups": [""], "resources": ["pods", "services", "services/status", "endpoints"],
             "verbs": ["*"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["*"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]});
    f.cp.kubectl_run(&["apply", "-f", "-"], Some(&rbac.to_string()))
        .unwrap();
    let kubeconfig = f.cp.kubeconfig_for_user(&user, None).unwrap();
    let restricted = controlplane::client_from(&kubeconfig).await.unwrap();
    // The real authorizer's view, before the manager starts: slices allowed (once the binding
    // reached its cache), Nodes denied.
    eventually("the binding to take effect", WAIT, || async {
        Api::<EndpointSlice>::namespaced(restricted.clone(), &f.ns)
            .list(&ListParams::default())
            .await
            .ok()
    })
    .await;
    let err = Api::<Node>::all(restricted.clone())
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "listing Nodes as {user}: {err}"
    );

    let _mgr = start(&restricted, manager_cfg("endpointslice"));
    create_service(&f, "norbac", json!({})).await;
    create_pod(&f, &node, "norbac", 3, true).await;
    let slices = wait_states(&f, "norbac", vec![st(3, true, true, false)]).await;
    let e = &slices[0].endpoints[0];
    assert_eq!(e.node_name.as_deref(), Some(node.as_str()));
    assert_eq!(e.zone, None, "no zone without read access to Nodes");
}

/// The upstream controller table (`manager::upstream`) is kube-controller-manager's own: the
/// reference binary's `--help` lists the same controllers and the same ones off by default. A
/// release bump that adds or renames one fails here, before a `--controllers kpr` cluster would
/// leave it running in kube-controller-manager or missing from a cluster without it.
#[test]
fn upstream_controller_table_matches_the_reference_binary() {
    use controllers::manager::upstream::{UpstreamDefault, UPSTREAM_CONTROLLERS};
    let bin = controlplane::Binaries::locate()
        .expect("reference binaries")
        .path("kube-controller-manager");
    let out = std::process::Command::new(&bin)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let help =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let list = |label: &str| -> Vec<String> {
        let line = help
            .lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label:?} line in kube-controller-manager --help"));
        let line = line.split(" (default").next().unwrap();
        line.split(',').map(|s| s.trim().to_string()).collect()
    };
    let all = list("All controllers:");
    let off = list("Disabled-by-default controllers:");
    let ours: Vec<_> = UPSTREAM_CONTROLLERS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(
        ours, all,
        "manager::upstream's names against kube-controller-manager --help"
    );
    let ours_off: Vec<_> = UPSTREAM_CONTROLLERS
        .iter()
        .filter(|(_, d)| *d == UpstreamDefault::OffByDefault)
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(ours_off, off, "controllers off by default");
}
