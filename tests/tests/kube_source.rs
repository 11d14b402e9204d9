//! The proxy's `kube` source against the test API server, through the real Kubernetes list/watch
//! protocol (kube-rs watchers), feeding the proxy's change tracker: the initial listing gates
//! programming, updates and deletes arrive as single changes, and a lost watch, a 410 Gone relist
//! or an API outage never makes the proxy forget or reprogram what did not change.
//!
//! No network namespaces here: what the source delivers is checked on the tracker, which is what
//! the sync runner hands to every backend (the end-to-end path with real traffic is
//! `controlplane_e2e.rs`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use proxy::dataplane::ChangeSet;
use proxy::model::Algorithm;
use proxy::selection::NodeContext;
use proxy::source::{self, SourceEvent};
use proxy::tracker::Tracker;
use serde_json::json;
use test_apiserver::TestApiServer;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

fn service(name: &str, ip: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                 "selector": {"app": name},
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
        "metadata": {"name": format!("{service}-abc"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap()
}

/// The source running against a test API server, and a tracker fed by what it sends.
struct Fixture {
    server: TestApiServer,
    client: Client,
    rx: mpsc::Receiver<SourceEvent>,
    tracker: Tracker,
    /// Every change the tracker reported since the last [`Fixture::take_changes`].
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
    /// A server already holding `n` Services `svc-i` with one slice of two endpoints each.
    async fn with_services(n: usize) -> Fixture {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().unwrap();
        for i in 0..n {
            let name = format!("svc-{i}");
            let ip = format!("10.96.1.{}", i + 1);
            create_service(&client, &name, &ip).await;
            let s = slice(&name, &[&format!("10.244.{i}.2"), &format!("10.244.{i}.3")]);
            slices(&client)
                .create(&PostParams::default(), &s)
                .await
                .unwrap();
        }
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(source::kube::run(server.client().unwrap(), tx));
        let node = NodeContext {
            node_name: "node".into(),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            node_ips: vec!["192.0.2.1".parse().unwrap()],
            masquerade_all: false,
        };
        Fixture {
            server,
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
                Err(_) => panic!("{what}: not reached within {WAIT:?}"),
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
    /// before each sync, collecting what it reports as changed.
    fn apply(&mut self, ev: SourceEvent) {
        self.synced |= ev.apply(&mut self.tracker);
        let c = self.tracker.take_changes();
        self.changes.full |= c.full;
        self.changes.changed.extend(c.changed);
        self.changes.removed_endpoints.extend(c.removed_endpoints);
        self.changes.became_reachable.extend(c.became_reachable);
    }

    /// What changed since the last call.
    fn take_changes(&mut self) -> ChangeSet {
        std::mem::take(&mut self.changes)
    }

    fn endpoints_of(&self, service: &str) -> Option<BTreeSet<String>> {
        let (_, eps) = self
            .tracker
            .state()
            .endpoints
            .iter()
            .find(|(n, _)| n.name == service)?;
        Some(eps.iter().map(|e| e.addr.to_string()).collect())
    }

    fn has_service(&self, service: &str) -> bool {
        self.tracker
            .state()
            .services
            .keys()
            .any(|n| n.name == service)
    }

    /// The service names in a change set.
    fn changed(changes: &ChangeSet) -> BTreeSet<String> {
        changes.changed.iter().map(|n| n.name.clone()).collect()
    }
}

fn slices(client: &Client) -> Api<EndpointSlice> {
    Api::namespaced(client.clone(), "default")
}

fn services(client: &Client) -> Api<Service> {
    Api::namespaced(client.clone(), "default")
}

async fn create_service(client: &Client, name: &str, ip: &str) {
    services(client)
        .create(&PostParams::default(), &service(name, ip))
        .await
        .unwrap();
}

async fn set_endpoints(client: &Client, service: &str, addresses: &[&str]) {
    let patch = json!({"endpoints": slice(service, addresses).endpoints});
    slices(client)
        .patch(
            &format!("{service}-abc"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Programming waits for the initial listing: `Synced` comes only after both watchers listed,
/// and by then every existing Service and slice is in the tracker; the first change set is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initial_listing_is_complete_before_synced() {
    let mut fx = Fixture::with_services(20).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    assert_eq!(fx.tracker.state().services.len(), 20);
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
    let mut fx = Fixture::with_services(5).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();

    set_endpoints(&fx.client, "svc-2", &["10.244.2.2"]).await;
    fx.pump_until("svc-2 lost an endpoint", |fx| {
        fx.endpoints_of("svc-2") == Some(set(&["10.244.2.2"]))
    })
    .await;
    let changes = fx.take_changes();
    assert!(!changes.full);
    assert_eq!(Fixture::changed(&changes), set(&["svc-2"]));
    assert_eq!(changes.removed_endpoints.len(), 1, "{changes:?}");

    create_service(&fx.client, "new", "10.96.2.1").await;
    fx.pump_until("new Service", |fx| fx.has_service("new"))
        .await;
    assert_eq!(Fixture::changed(&fx.take_changes()), set(&["new"]));

    services(&fx.client)
        .delete("svc-4", &DeleteParams::default())
        .await
        .unwrap();
    fx.pump_until("svc-4 deleted", |fx| !fx.has_service("svc-4"))
        .await;
    assert_eq!(Fixture::changed(&fx.take_changes()), set(&["svc-4"]));
}

/// Watches dropped while the history was compacted: the watchers get 410 Gone, relist, and the
/// relist changes only what changed meanwhile (nothing is reprogrammed for the others), including
/// a delete the watch never saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_watch_and_410_relist_touch_only_what_changed() {
    let mut fx = Fixture::with_services(30).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();
    let before = fx.server.faults().requests();

    // Everything below happens while no watch is open to see it.
    fx.server.faults().fail_for(Duration::from_secs(2));
    fx.server.faults().drop_watches();
    fx.drain_for(Duration::from_millis(500)).await;
    // Writes straight into the store (the API answers 500 for now), then the history is dropped.
    rewrite_in_store(&fx.server, "svc-7", &["10.244.7.9"]);
    delete_in_store(&fx.server, "svc-9");
    fx.server.compact();

    fx.pump_until("relisted after 410", |fx| {
        fx.endpoints_of("svc-7") == Some(set(&["10.244.7.9"])) && !fx.has_service("svc-9")
    })
    .await;
    fx.drain_for(Duration::from_millis(500)).await;
    assert!(
        fx.server.faults().requests() > before,
        "the watchers came back"
    );
    let changes = fx.take_changes();
    assert!(!changes.full, "a relist is not a full resync");
    assert_eq!(Fixture::changed(&changes), set(&["svc-7", "svc-9"]));
    assert_eq!(fx.tracker.state().services.len(), 29);
}

/// During an API outage (every request 500, watches dropped) nothing programmed is forgotten; when
/// the API recovers, the proxy converges on what changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_keeps_the_state_and_converges_after() {
    let mut fx = Fixture::with_services(10).await;
    fx.pump_until("Synced", |fx| fx.synced).await;
    let _ = fx.take_changes();

    fx.server.faults().fail_for(Duration::from_secs(4));
    fx.server.faults().drop_watches();
    // The streams close asynchronously: let them, so the write below reaches no open watch.
    fx.drain_for(Duration::from_millis(500)).await;
    rewrite_in_store(&fx.server, "svc-3", &["10.244.3.7", "10.244.3.8"]);
    fx.drain_for(Duration::from_millis(1500)).await;
    assert_eq!(fx.tracker.state().services.len(), 10, "nothing forgotten");
    assert_eq!(
        fx.endpoints_of("svc-3"),
        Some(set(&["10.244.3.2", "10.244.3.3"])),
        "the last known endpoints stay while the API is down"
    );
    assert!(
        Fixture::changed(&fx.take_changes()).is_empty(),
        "no change during the outage"
    );

    fx.pump_until("converged after the outage", |fx| {
        fx.endpoints_of("svc-3") == Some(set(&["10.244.3.7", "10.244.3.8"]))
    })
    .await;
    fx.drain_for(Duration::from_millis(500)).await;
    let changes = fx.take_changes();
    assert_eq!(Fixture::changed(&changes), set(&["svc-3"]));
}

/// Replaces a Service's slice in the server's store directly (no HTTP: the API may be failing).
fn rewrite_in_store(server: &TestApiServer, service: &str, addresses: &[&str]) {
    let name = format!("{service}-abc");
    let mut obj = server
        .get("endpointslices", Some("default"), &name)
        .unwrap();
    obj["endpoints"] = serde_json::to_value(slice(service, addresses).endpoints).unwrap();
    server.replace("endpointslices", obj).unwrap();
}

fn delete_in_store(server: &TestApiServer, service: &str) {
    server.remove("services", Some("default"), service).unwrap();
    server
        .remove("endpointslices", Some("default"), &format!("{service}-abc"))
        .unwrap();
}
