//! The proxy's `kube` source against the reference kube-apiserver (etcd behind it, TLS, RBAC),
//! through kube-rs watchers, feeding the proxy's change tracker: the initial listing gates
//! programming, updates and deletes arrive as single changes, and a cut watch, an expired
//! resourceVersion (etcd compacted, 410 Gone, relist) or an API server that stops and restarts
//! never makes the proxy forget or reprogram what did not change.
//!
//! The ordinary tests share one control plane (each in its own namespace, so every assertion is
//! about that namespace: the source watches all of them); the fault tests stop and restart an API
//! server and get one of their own. No network namespaces here: what the source delivers is
//! checked on the tracker, which is what the sync runner hands to every backend (the path with
//! real traffic is `controlplane_e2e.rs`).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use controlplane::{ControlPlane, Options, Relay};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client};
use proxy::model::Algorithm;
use proxy::selection::NodeContext;
use proxy::source::{self, SourceEvent};
use proxy::state::ChangeSet;
use proxy::tracker::Tracker;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long the source gets to show a change. Generous on purpose: after a partition the watchers
/// retry with kube-rs's default backoff (client-go's: 0.8 s doubling to 30 s, each delay with up to
/// as much jitter again), and the first attempt after the cut heals can itself fail with 410 and
/// back off once more before the relist; on a loaded 2-core machine that has taken over 90 s.
const WAIT: Duration = Duration::from_secs(240);

/// A Service whose clusterIP the API server allocates.
fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    }))
    .unwrap()
}

fn slice(service: &str, addresses: &[&str]) -> EndpointSlice {
    let endpoints: Vec<_> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true, "serving": true, "terminating": false}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap()
}

/// The source running against a reference API server, and a tracker fed by what it sends.
struct Fixture {
    /// The test's namespace: every assertion is about the objects in it.
    ns: String,
    client: Client,
    rx: mpsc::Receiver<SourceEvent>,
    tracker: Tracker,
    /// Every change the tracker reported in `ns` since the last [`Fixture::take_changes`].
    changes: ChangeSet,
    synced: bool,
    task: JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fixture {
    /// `n` Services `svc-i` with one slice of two endpoints each in a fresh namespace of `cp`,
    /// then the source started with `source_kubeconfig` (the admin's, or one through a relay).
    async fn with_services(cp: &ControlPlane, n: usize, source_client: Option<Client>) -> Fixture {
        // The source's warnings (watch failures, backoff) and kube's request log, captured per
        // test and shown when it fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "proxy=debug,kube=debug,kube_runtime=debug".into()),
            )
            .with_test_writer()
            .try_init();
        let ns = cp.test_namespace("kube-source").unwrap();
        let client = cp.client().await.unwrap();
        for i in 0..n {
            let name = format!("svc-{i}");
            create_service(&client, &ns, &name).await;
            let s = slice(&name, &[&format!("10.244.{i}.2"), &format!("10.244.{i}.3")]);
            slices(&client, &ns)
                .create(&PostParams::default(), &s)
                .await
                .unwrap();
        }
        let (tx, rx) = mpsc::channel(1024);
        let source_client = source_client.unwrap_or_else(|| client.clone());
        let task = tokio::spawn(source::kube::run(
            source_client,
            tx,
            Algorithm::RoundRobin,
            "node-a".into(),
        ));
        let node = NodeContext {
            node_name: "node".into(),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            node_ips: vec!["192.0.2.1".parse().unwrap()],
            masquerade_all: false,
            zone: None,
            maglev_table_size: Default::default(),
        };
        Fixture {
            ns,
            client,
            rx,
            tracker: Tracker::new(Algorithm::RoundRobin, node),
            changes: ChangeSet::default(),
            synced: false,
            task,
        }
    }

    /// Applies source events until `done` holds for the tracker (checked after each event).
    async fn pump_until(&mut self, what: &str, done: impl Fn(&Fixture) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(ev)) => self.apply(ev),
                Ok(None) => panic!("{what}: the source stopped"),
                Err(_) => panic!(
                    "{what}: not reached within {WAIT:?} (the source task {}; {} Services known, \
                     synced {})",
                    if self.task.is_finished() {
                        "ended"
                    } else {
                        "still runs"
                    },
                    self.service_count(),
                    self.synced
                ),
            }
        }
    }

    /// Applies whatever the source sends within `quiet` (nothing must be pending after it).
    async fn drain_for(&mut self, quiet: Duration) {
        while let Ok(Some(ev)) = tokio::time::timeout(quiet, self.rx.recv()).await {
            self.apply(ev);
        }
    }

    /// Applies one event and brings the tracker's state up to date, as the sync runner does
    /// before each sync, collecting what it reports as changed in this test's namespace.
    fn apply(&mut self, ev: SourceEvent) {
        self.synced |= ev.apply(&mut self.tracker);
        let c = self.tracker.take_changes();
        let ns = self.ns.clone();
        self.changes.full |= c.full;
        self.changes
            .changed
            .extend(c.changed.into_iter().filter(|n| *n.namespace == *ns));
        self.changes.removed_endpoints.extend(
            c.removed_endpoints
                .into_iter()
                .filter(|(n, _)| *n.namespace == *ns),
        );
        self.changes.became_reachable.extend(
            c.became_reachable
                .into_iter()
                .filter(|n| *n.namespace == *ns),
        );
    }

    /// What changed since the last call.
    fn take_changes(&mut self) -> ChangeSet {
        std::mem::take(&mut self.changes)
    }

    fn endpoints_of(&self, service: &str) -> Option<BTreeSet<String>> {
        let (_, eps) = self
            .tracker
            .state()
            .iter()
            .find(|(n, _)| *n.namespace == *self.ns && &*n.name == service)?;
        Some(eps.endpoints.iter().map(|e| e.addr.to_string()).collect())
    }

    fn has_service(&self, service: &str) -> bool {
        self.tracker
            .state()
            .names()
            .any(|n| *n.namespace == *self.ns && &*n.name == service)
    }

    fn service_count(&self) -> usize {
        self.tracker
            .state()
            .names()
            .filter(|n| *n.namespace == *self.ns)
            .count()
    }

    /// The service names in a change set.
    fn changed(changes: &ChangeSet) -> BTreeSet<String> {
        changes.changed.iter().map(|n| n.name.to_string()).collect()
    }
}

fn slices(client: &Client, ns: &str) -> Api<EndpointSlice> {
    Api::namespaced(client.clone(), ns)
}

fn services(client: &Client, ns: &str) -> Api<Service> {
    Api::namespaced(client.clone(), ns)
}

async fn create_service(client: &Client, ns: &str, name: &str) {
    services(client, ns)
        .create(&PostParams::default(), &service(name))
        .await
        .unwrap();
}

async fn set_endpoints(client: &Client, ns: &str, service: &str, addresses: &[&str]) {
    let patch = json!({"endpoints": slice(service, addresses).endpoints});
    slices(client, ns)
        .patch(
            &format!("{service}-abc"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

async fn delete_service(client: &Client, ns: &str, service: &str) {
    services(client, ns)
        .delete(service, &DeleteParams::default())
        .await
        .unwrap();
    slices(client, ns)
        .delete(&format!("{service}-abc"), &DeleteParams::default())
        .await
        .unwrap();
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn shared() -> &'static ControlPlane {
    controlplane::shared().expect("the reference control plane")
}

/// A control plane of the test's own, for faults that would disturb the other tests.
fn private(tag: &str) -> ControlPlane {
    ControlPlane::start(Options::minimal(controlplane::run_dir(tag))).unwrap()
}

/// Programming waits for the initial listing: `Synced` comes only after both watchers listed,
/// and by then every existing Service and slice is in the tracker; the first change set is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initial_listing_is_complete_before_synced() {
    let mut fx = Fixture::with_services(shared(), 20, None).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    assert_eq!(fx.service_count(), 20);
    for i in 0..20 {
        assert_eq!(
            fx.endpoints_of(&format!("svc-{i}")),
            Some(set(&[&format!("10.244.{i}.2"), &format!("10.244.{i}.3")])),
            "svc-{i}"
        );
    }
    let first = fx.take_changes();
    assert!(first.full, "the first sync after the listing is a full one");
}

/// Creates, endpoint updates and deletes arrive as single changes of the objects concerned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_deletes_change_only_their_service() {
    let mut fx = Fixture::with_services(shared(), 5, None).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();

    set_endpoints(&fx.client, &fx.ns, "svc-2", &["10.244.2.2"]).await;
    fx.pump_until("svc-2 lost an endpoint", |fx| {
        fx.endpoints_of("svc-2") == Some(set(&["10.244.2.2"]))
    })
    .await;
    let changes = fx.take_changes();
    assert!(!changes.full);
    assert_eq!(Fixture::changed(&changes), set(&["svc-2"]));
    assert_eq!(changes.removed_endpoints.len(), 1, "{changes:?}");

    create_service(&fx.client, &fx.ns, "new").await;
    fx.pump_until("new Service", |fx| fx.has_service("new"))
        .await;
    assert_eq!(Fixture::changed(&fx.take_changes()), set(&["new"]));

    services(&fx.client, &fx.ns)
        .delete("svc-4", &DeleteParams::default())
        .await
        .unwrap();
    fx.pump_until("svc-4 deleted", |fx| !fx.has_service("svc-4"))
        .await;
    assert_eq!(Fixture::changed(&fx.take_changes()), set(&["svc-4"]));
}

/// The node loses the API server (a partition: every connection cut, none let through) while
/// Services change, and meanwhile etcd's history is compacted and the API server restarted, so
/// the resourceVersion the watchers resume from has expired: they get 410 Gone and relist, and
/// the relist changes only what changed meanwhile (nothing is reprogrammed for the others),
/// including a delete the watch never saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_watch_and_an_expired_resource_version_touch_only_what_changed() {
    let mut cp = private("kube-source-410");
    let relay = Relay::start(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        format!("127.0.0.1:{}", cp.ports.apiserver).parse().unwrap(),
    )
    .unwrap();
    let through_relay = cp
        .admin_kubeconfig_for(&format!("https://{}", relay.addr()))
        .unwrap();
    let kc_path = cp.dir.join("relay.kubeconfig");
    std::fs::write(&kc_path, through_relay).unwrap();
    let source_client = controlplane::client_from(&kc_path).await.unwrap();
    let mut fx = Fixture::with_services(&cp, 30, Some(source_client)).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();
    let seen = services(&fx.client, &fx.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    // Everything below happens while no watch of the source is open to see it.
    relay.cut();
    fx.drain_for(Duration::from_millis(500)).await;
    set_endpoints(&fx.client, &fx.ns, "svc-7", &["10.244.7.9"]).await;
    delete_service(&fx.client, &fx.ns, "svc-9").await;
    cp.stop_apiserver();
    cp.compact_etcd().unwrap();
    cp.start_apiserver().unwrap();
    let client = cp.client().await.unwrap();
    fx.client = client.clone();

    // The version the source last saw is gone for good: a watch from it is refused with 410.
    let mut old = services(&client, &fx.ns)
        .watch(&WatchParams::default(), &seen)
        .await
        .unwrap()
        .boxed();
    match old.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("a watch from the compacted version {seen} got {other:?}"),
    }

    relay.heal();
    let ns = fx.ns.clone();
    fx.pump_until("relisted after 410", |fx| {
        fx.endpoints_of("svc-7") == Some(set(&["10.244.7.9"])) && !fx.has_service("svc-9")
    })
    .await;
    fx.drain_for(Duration::from_millis(1000)).await;
    let changes = fx.take_changes();
    assert!(!changes.full, "a relist is not a full resync");
    assert_eq!(
        Fixture::changed(&changes),
        set(&["svc-7", "svc-9"]),
        "in {ns}"
    );
    assert_eq!(fx.service_count(), 29);
}

/// The API server stops (every watch cut, every request refused) and comes back: nothing
/// programmed is forgotten meanwhile, and afterwards the proxy converges on what changed and
/// reports nothing else as changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_keeps_the_state_and_converges_after() {
    let mut cp = private("kube-source-restart");
    let mut fx = Fixture::with_services(&cp, 10, None).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();

    cp.stop_apiserver();
    fx.drain_for(Duration::from_millis(1500)).await;
    assert_eq!(fx.service_count(), 10, "nothing forgotten");
    assert_eq!(
        fx.endpoints_of("svc-3"),
        Some(set(&["10.244.3.2", "10.244.3.3"])),
        "the last known endpoints stay while the API server is down"
    );
    assert!(
        Fixture::changed(&fx.take_changes()).is_empty(),
        "no change during the outage"
    );

    cp.start_apiserver().unwrap();
    fx.client = cp.client().await.unwrap();
    set_endpoints(&fx.client, &fx.ns, "svc-3", &["10.244.3.7", "10.244.3.8"]).await;
    fx.pump_until("converged after the restart", |fx| {
        fx.endpoints_of("svc-3") == Some(set(&["10.244.3.7", "10.244.3.8"]))
    })
    .await;
    fx.drain_for(Duration::from_millis(1000)).await;
    let changes = fx.take_changes();
    assert_eq!(Fixture::changed(&changes), set(&["svc-3"]));
    assert_eq!(fx.service_count(), 10);
}
