//! Object counts for every resource a quota counts by name alone (`configmaps`, `secrets`,
//! `count/deployments.apps`, a custom resource's `count/widgets.example.com`...): one
//! metadata-only watch per such resource, started the first time a quota names it, holding each
//! namespace's object names (upstream's quota monitors, which watch every quotable resource
//! discovery lists; here only those a quota asks about).
//!
//! A resource is countable when aggregated discovery lists it namespaced with the verbs
//! `create`, `list`, `watch` and `delete` (upstream's `GetQuotableResources`); discovery is read
//! again when a quota names a resource it did not list, at most every [`REDISCOVERY`]. Deletions
//! (and objects gone after a re-listing) are reported to the controller, which resyncs the
//! namespace's quotas counting that resource (upstream's replenishment).
//!
//! Owns the watches and their name sets; no quota logic.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::DynamicObject;
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client};

use super::evaluate::GroupResource;
use crate::helpers::discovery::{group_versions, is_namespaced, Gvr};

/// The shortest time between two discovery reads for an unknown resource.
pub const REDISCOVERY: Duration = Duration::from_secs(30);

/// Called with a resource and a namespace where an object of it went away.
pub type OnGone = Arc<dyn Fn(&GroupResource, &str) + Send + Sync>;

/// One resource's object names by namespace.
#[derive(Default)]
pub struct Counter {
    names: RwLock<HashMap<String, HashSet<String>>>,
    synced: AtomicBool,
    synced_notify: tokio::sync::Notify,
}

impl Counter {
    /// How many objects `namespace` holds.
    pub fn count(&self, namespace: &str) -> usize {
        self.names
            .read()
            .expect("counter lock")
            .get(namespace)
            .map_or(0, HashSet::len)
    }

    /// Whether the first complete listing arrived.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits for the first complete listing, at most `timeout`; whether it arrived.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.synced_notify.notified();
            if self.synced() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.synced();
            }
        }
    }
}

/// The countable resources and the running watches.
pub struct Counts {
    client: Client,
    on_gone: OnGone,
    discovered: tokio::sync::Mutex<Discovered>,
    watches: Mutex<HashMap<GroupResource, (Arc<Counter>, tokio::task::AbortHandle)>>,
}

#[derive(Default)]
struct Discovered {
    at: Option<Instant>,
    countable: HashMap<GroupResource, ApiResource>,
}

impl Drop for Counts {
    fn drop(&mut self) {
        for (_, (_, task)) in self.watches.lock().expect("watches lock").drain() {
            task.abort();
        }
    }
}

impl Counts {
    /// No watches yet; `on_gone` hears of every deletion.
    pub fn new(client: Client, on_gone: OnGone) -> Self {
        Self {
            client,
            on_gone,
            discovered: tokio::sync::Mutex::new(Discovered::default()),
            watches: Mutex::new(HashMap::new()),
        }
    }

    /// The resources watched so far.
    pub fn watched(&self) -> BTreeSet<GroupResource> {
        self.watches
            .lock()
            .expect("watches lock")
            .keys()
            .cloned()
            .collect()
    }

    /// The counter of `gr`, its watch started if it was not running; `Ok(None)` when the API
    /// server serves no countable resource of that name.
    pub async fn counter(&self, gr: &GroupResource) -> Result<Option<Arc<Counter>>, kube::Error> {
        if let Some((c, _)) = self.watches.lock().expect("watches lock").get(gr) {
            return Ok(Some(c.clone()));
        }
        let ar = {
            let mut d = self.discovered.lock().await;
            let stale = d.at.is_none_or(|at| at.elapsed() >= REDISCOVERY);
            if !d.countable.contains_key(gr) && stale {
                d.countable = discover(&self.client).await?;
                d.at = Some(Instant::now());
            }
            match d.countable.get(gr) {
                Some(ar) => ar.clone(),
                None => return Ok(None),
            }
        };
        let mut watches = self.watches.lock().expect("watches lock");
        if let Some((c, _)) = watches.get(gr) {
            return Ok(Some(c.clone()));
        }
        let counter = Arc::new(Counter::default());
        let task = tokio::spawn(watch(
            self.client.clone(),
            ar,
            gr.clone(),
            counter.clone(),
            self.on_gone.clone(),
        ))
        .abort_handle();
        tracing::info!(resource = %gr, "resourcequota: counting objects");
        watches.insert(gr.clone(), (counter.clone(), task));
        Ok(Some(counter))
    }
}

/// The countable resources (namespaced, with create, list, watch and delete) at their preferred
/// versions, from aggregated discovery (`/api` then `/apis`).
async fn discover(client: &Client) -> Result<HashMap<GroupResource, ApiResource>, kube::Error> {
    let docs = [
        client.list_core_api_versions_aggregated().await?,
        client.list_api_groups_aggregated().await?,
    ];
    let mut out = HashMap::new();
    // Versions come in preference order: a resource is taken at the first serving it.
    for gv in group_versions(&docs).into_iter().filter(|gv| !gv.stale) {
        for (plural, res) in gv.resources {
            let countable = is_namespaced(res)
                && ["create", "list", "watch", "delete"]
                    .iter()
                    .all(|verb| res.verbs.iter().any(|x| x == verb));
            let Some(kind) = res.response_kind.as_ref().and_then(|k| k.kind.as_deref()) else {
                continue;
            };
            if !countable {
                continue;
            }
            let gr = GroupResource {
                group: gv.group.clone(),
                resource: plural.clone(),
            };
            out.entry(gr)
                .or_insert_with(|| Gvr::new(&gv.group, &gv.version, &plural).api_resource(kind));
        }
    }
    Ok(out)
}

fn ns_name(obj: &PartialObjectMeta<DynamicObject>) -> (String, String) {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// Keeps `counter` up to date from a metadata-only watch of `ar`.
async fn watch(
    client: Client,
    ar: ApiResource,
    gr: GroupResource,
    counter: Arc<Counter>,
    on_gone: OnGone,
) {
    let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &ar);
    let config = crate::runtime::informer::watcher_config().any_semantic();
    // An `Api` of partial objects asks for metadata only.
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    // A listing in progress (the first, or after the watch expired).
    let mut listing: Option<HashMap<String, HashSet<String>>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(resource = %gr, "resourcequota count watch: {e}");
                continue;
            }
        };
        match ev {
            watcher::Event::Init => listing = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                let (ns, name) = ns_name(&obj);
                listing
                    .get_or_insert_with(HashMap::new)
                    .entry(ns)
                    .or_default()
                    .insert(name);
            }
            watcher::Event::InitDone => {
                let fresh = listing.take().unwrap_or_default();
                let gone: Vec<String> = {
                    let mut names = counter.names.write().expect("counter lock");
                    let gone = names
                        .iter()
                        .filter(|(ns, old)| {
                            let new = fresh.get(*ns);
                            old.iter().any(|n| !new.is_some_and(|s| s.contains(n)))
                        })
                        .map(|(ns, _)| ns.clone())
                        .collect();
                    *names = fresh;
                    gone
                };
                counter.synced.store(true, Ordering::Release);
                counter.synced_notify.notify_waiters();
                for ns in gone {
                    on_gone(&gr, &ns);
                }
            }
            watcher::Event::Apply(obj) => {
                let (ns, name) = ns_name(&obj);
                counter
                    .names
                    .write()
                    .expect("counter lock")
                    .entry(ns)
                    .or_default()
                    .insert(name);
            }
            watcher::Event::Delete(obj) => {
                let (ns, name) = ns_name(&obj);
                let removed = {
                    let mut names = counter.names.write().expect("counter lock");
                    let removed = names.get_mut(&ns).is_some_and(|s| s.remove(&name));
                    if names.get(&ns).is_some_and(HashSet::is_empty) {
                        names.remove(&ns);
                    }
                    removed
                };
                if removed {
                    on_gone(&gr, &ns);
                }
            }
        }
    }
}
