//! The EndpointSlice controller: keeps the EndpointSlices of every Service with a selector in step
//! with its Pods.
//!
//! Shape: `Controller::for_stream(services).owns_stream(slices).reconcile_on(pod triggers)`. The
//! reconcile reads the indexed caches, computes a `plan::Plan` with pure functions and applies it:
//! creates, then updates (with the resourceVersion read, so a stale cache gets 409 and a retry), then
//! deletes. A tracker remembers the generation of every slice written, and a reconcile whose cache
//! has not yet seen them waits (requeue) instead of planning from stale slices, as upstream's
//! EndpointSliceTracker does. Deleted Services get their slices removed here (there may be no
//! garbage collector). Must not touch slices managed by anyone else.
//!
//! Nodes are optional. Once the Node cache is synced, the plan can be told for each Pod whether
//! its Node exists (and its zone): a Pod whose Node is missing is then left out unless the Service
//! has publishNotReadyAddresses, as upstream. Until then, and for good when Nodes may not be read (403), nothing is known of Nodes:
//! every Pod is kept, without a zone. Node creation, deletion, zone changes and relistings
//! re-reconcile the Services with Pods there (upstream instead retries the Service with backoff).

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use crate::endpoint::inputs::{self, Inputs};
use crate::error::{Error, Result};
use crate::runtime::cache::{Change, Indexed, Key};
use crate::runtime::cached_pod::CachedPod;

/// How long the first reconcile waits for the Node listing (zones) before going on without it.
const NODES_WAIT: Duration = Duration::from_secs(2);

/// How long a written slice may stay unseen by the cache before the tracker gives up on it.
const EXPECTATION_TTL: Duration = Duration::from_secs(10);

/// Index of a slice: `ns/service-name`.
pub fn slice_index(s: &EndpointSlice) -> Vec<String> {
    s.labels()
        .get(plan::LABEL_SERVICE_NAME)
        .map(|svc| vec![format!("{}/{svc}", s.namespace().unwrap_or_default())])
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Generation(i64),
    Gone,
}

/// Slices written per Service that the cache must reflect before the next plan.
#[derive(Default)]
struct Tracker(Mutex<HashMap<Key, Pending>>);

/// Slice name -> what the cache must show, and since when.
type Pending = HashMap<String, (Expect, Instant)>;

impl Tracker {
    fn expect(&self, svc: &Key, slice: String, e: Expect) {
        let mut m = self.0.lock().expect("tracker lock");
        m.entry(svc.clone())
            .or_default()
            .insert(slice, (e, Instant::now()));
    }

    /// True while some write of this Service is not yet visible in `slices`.
    fn stale(&self, svc: &Key, slices: &Indexed<EndpointSlice>) -> bool {
        let mut m = self.0.lock().expect("tracker lock");
        let Some(pending) = m.get_mut(svc) else {
            return false;
        };
        pending.retain(|name, (e, at)| {
            let cached = slices.get(&svc.0, name);
            let seen = match e {
                Expect::Gone => cached.is_none(),
                Expect::Generation(g) => {
                    cached.is_some_and(|c| c.metadata.generation.unwrap_or(0) >= *g)
                }
            };
            !seen && at.elapsed() < EXPECTATION_TTL
        });
        let stale = !pending.is_empty();
        if !stale {
            m.remove(svc);
        }
        stale
    }
}

/// Shared by every reconcile.
pub struct Context {
    client: Client,
    pods: Arc<Indexed<CachedPod>>,
    nodes: Arc<Indexed<Node>>,
    slices: Arc<Indexed<EndpointSlice>>,
    tracker: Tracker,
    nodes_gate: tokio::sync::OnceCell<()>,
}

/// Options.
#[derive(Debug, Clone)]
pub struct Config {
    /// Reconciles running at once.
    pub concurrency: u16,
}

impl Default for Config {
    fn default() -> Self {
        Self { concurrency: 16 }
    }
}

/// Runs the controller until the client's streams end (normally: forever).
pub async fn run(client: Client, cfg: Config) {
    let Inputs {
        reader,
        services,
        pods,
        service_stream,
        pod_triggers,
        deleted,
    } = inputs::inputs(&client);
    let slices = Indexed::new(slice_index);
    let slice_cache = slices.clone();
    let managed = format!("{}={}", plan::LABEL_MANAGED_BY, plan::MANAGED_BY);
    let slice_stream = watcher::watcher(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&managed),
    )
    .default_backoff()
    .map_ok(move |ev| {
        slice_cache.apply(&ev);
        ev
    })
    .touched_objects();
    let nodes = Indexed::new(|_: &Node| Vec::new());
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods,
        nodes: nodes.clone(),
        slices,
        tracker: Tracker::default(),
        nodes_gate: tokio::sync::OnceCell::new(),
    });
    let node_triggers = node_triggers(&client, nodes, ctx.pods.clone(), services.clone());
    tokio::spawn(cleanup_deleted(ctx.clone(), deleted));
    tokio::spawn(sweep_orphans(ctx.clone(), services));
    Controller::for_stream(service_stream, reader)
        .owns_stream(slice_stream)
        .reconcile_on(pod_triggers)
        .reconcile_on(node_triggers)
        .with_config(controller::Config::default().concurrency(cfg.concurrency))
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("endpointslice controller: {e}");
            }
            futures::future::ready(())
        })
        .await;
}

fn svc_key(svc: &Service) -> Key {
    (svc.namespace().unwrap_or_default(), svc.name_any())
}

fn zone(n: &Option<Arc<Node>>) -> Option<&String> {
    n.as_ref().and_then(|n| n.labels().get(plan::LABEL_ZONE))
}

/// What is known of a Node: nothing before the cache is synced (or when Nodes are forbidden),
/// else whether it exists and its zone.
fn node_info(nodes: &Indexed<Node>, name: &str) -> plan::NodeInfo {
    if !nodes.is_ready() {
        return plan::NodeInfo::Unreadable;
    }
    match nodes.get("", name) {
        Some(n) => plan::NodeInfo::Known {
            zone: n.labels().get(plan::LABEL_ZONE).cloned(),
        },
        // Upstream's reconciler leaves such a Pod out (unless publishNotReadyAddresses).
        None => plan::NodeInfo::Missing,
    }
}

/// Services to reconcile because a Node appeared, went away or changed its zone label (their
/// endpoints on it carry the zone, and Pods on a missing Node are left out).
fn node_triggers(
    client: &Client,
    nodes: Arc<Indexed<Node>>,
    pods: Arc<Indexed<CachedPod>>,
    services: Arc<Indexed<Service>>,
) -> impl futures::Stream<Item = ObjectRef<Service>> + Send + 'static {
    watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .filter_map(move |ev| {
            let mut refs = Vec::new();
            if let Ok(ev) = ev {
                let changed: Vec<String> = match nodes.apply(&ev) {
                    Change::One { old, new }
                        if zone(&old) != zone(&new) || old.is_some() != new.is_some() =>
                    {
                        old.as_ref()
                            .or(new.as_ref())
                            .map(|n| n.name_any())
                            .into_iter()
                            .collect()
                    }
                    // A (re)listing: any Node may have appeared, gone or changed its zone (and the
                    // first one turns "nothing known" into "known"): every Pod's Services.
                    Change::Relisted => {
                        let mut set = std::collections::HashSet::new();
                        for pod in pods.all() {
                            set.extend(inputs::services_for(&services, &pod));
                        }
                        refs.extend(set);
                        Vec::new()
                    }
                    _ => Vec::new(),
                };
                for name in changed {
                    for pod in pods.by_index(&format!("node:{name}")) {
                        refs.extend(inputs::services_for(&services, &pod));
                    }
                }
            }
            futures::future::ready(Some(futures::stream::iter(refs)))
        })
        .flatten()
}

/// Plans and applies the slices of one Service.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    ctx.pods.wait_ready().await;
    ctx.slices.wait_ready().await;
    // Nodes are optional: without read access to Nodes (or before they are listed) endpoints carry
    // no zone and no Pod is left out for its Node; a later Node listing re-reconciles. The first
    // reconcile waits briefly, once.
    ctx.nodes_gate
        .get_or_init(|| async {
            if tokio::time::timeout(NODES_WAIT, ctx.nodes.wait_ready()).await.is_err() {
                tracing::warn!("endpointslice: Nodes not listed within {NODES_WAIT:?}: endpoints get no zone (and Pods on missing Nodes are kept) until they are");
            }
        })
        .await;
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let key = svc_key(&svc);
    if ctx.tracker.stale(&key, &ctx.slices) {
        return Ok(Action::requeue(Duration::from_millis(50)));
    }
    let pods = inputs::pods_for(&ctx.pods, &svc);
    let existing = ctx.slices.by_index(&format!("{}/{}", key.0, key.1));
    let node_of = |node: &str| node_info(&ctx.nodes, node);
    let plan = plan::plan_with_nodes(&svc, &pods, &existing, &node_of);
    if !plan.is_empty() {
        apply(&ctx, &key, plan).await?;
    }
    Ok(Action::await_change())
}

/// Applies a plan: creates first, then updates, then deletes (endpoints are never missing in between).
async fn apply(ctx: &Context, key: &Key, plan: plan::Plan) -> Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &key.0);
    let obj = |name: &str| format!("{}/{name}", key.0);
    for slice in plan.create {
        let created = api
            .create(&PostParams::default(), &slice)
            .await
            .map_err(|e| Error::kube("creating EndpointSlice for Service", obj(&key.1), e))?;
        ctx.tracker.expect(
            key,
            created.name_any(),
            Expect::Generation(created.metadata.generation.unwrap_or(0)),
        );
    }
    for slice in plan.update {
        let name = slice.name_any();
        let updated = api
            .replace(&name, &PostParams::default(), &slice)
            .await
            .map_err(|e| Error::kube("updating EndpointSlice", obj(&name), e))?;
        ctx.tracker.expect(
            key,
            name,
            Expect::Generation(updated.metadata.generation.unwrap_or(0)),
        );
    }
    for slice in plan.delete {
        delete_slice(&api, &slice).await?;
        ctx.tracker.expect(key, slice.name_any(), Expect::Gone);
    }
    Ok(())
}

async fn delete_slice(api: &Api<EndpointSlice>, slice: &EndpointSlice) -> Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: slice.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&slice.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(
            "deleting EndpointSlice",
            format!(
                "{}/{}",
                slice.namespace().unwrap_or_default(),
                slice.name_any()
            ),
            e,
        )),
    }
}

/// Deletes the managed slices owned by Services that went away.
async fn cleanup_deleted(
    ctx: Arc<Context>,
    mut deleted: tokio::sync::mpsc::UnboundedReceiver<Service>,
) {
    while let Some(svc) = deleted.recv().await {
        let key = svc_key(&svc);
        let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &key.0);
        let owned = ctx.slices.by_index(&format!("{}/{}", key.0, key.1));
        for slice in owned.iter().filter(|s| {
            s.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == svc.uid().as_ref())
        }) {
            if let Err(e) = delete_slice(&api, slice).await {
                tracing::warn!("cleaning up after deleted Service {}/{}: {e}", key.0, key.1);
            }
        }
    }
}

/// The managed slices whose Service (by name and uid) is not in `services`.
pub fn orphans(
    slices: &[Arc<EndpointSlice>],
    services: &Indexed<Service>,
) -> Vec<Arc<EndpointSlice>> {
    slices
        .iter()
        .filter(|s| plan::is_managed(s))
        .filter(|s| {
            let ns = s.namespace().unwrap_or_default();
            let owner = s
                .labels()
                .get(plan::LABEL_SERVICE_NAME)
                .and_then(|name| services.get(&ns, name));
            let owner_uid = s
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone());
            owner.is_none_or(|svc| svc.uid() != owner_uid)
        })
        .cloned()
        .collect()
}

/// Deletes slices left behind by Services deleted while no controller ran: once the caches are
/// complete, and then every minute.
async fn sweep_orphans(ctx: Arc<Context>, services: Arc<Indexed<Service>>) {
    services.wait_ready().await;
    ctx.slices.wait_ready().await;
    loop {
        for slice in orphans(&ctx.slices.all(), &services) {
            let api: Api<EndpointSlice> =
                Api::namespaced(ctx.client.clone(), &slice.namespace().unwrap_or_default());
            match delete_slice(&api, &slice).await {
                Ok(()) => tracing::info!(
                    "endpointslice: deleted orphaned slice {}/{}",
                    slice.namespace().unwrap_or_default(),
                    slice.name_any()
                ),
                Err(e) => tracing::warn!("endpointslice: orphan sweep: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
}

/// Requeues a failed reconcile after a second.
pub fn error_policy(svc: Arc<Service>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::info!(
        "endpointslice: Service {}/{}: {err}",
        svc.namespace().unwrap_or_default(),
        svc.name_any()
    );
    Action::requeue(Duration::from_secs(1))
}
