//! The `kube` source: kube-rs watchers on Services and EndpointSlices, and on this node's Node
//! object for its zone label (topology hints).
//!
//! Each watcher's (re)list is forwarded as one complete listing (`Replace*`), so objects deleted while
//! the watch was down are deleted here too; single events are forwarded as they come. Objects are
//! converted as they arrive: a listing is buffered as [`ServiceEntry`] / [`SliceEntry`] values,
//! while the watcher holds at most one page of whole objects. When the API
//! server goes away the watchers back off and retry; nothing is torn down meanwhile: the last
//! programmed state keeps serving.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;

use super::SourceEvent;
use crate::convert::{ServiceEntry, SliceEntry};
use crate::model::Algorithm;

/// Builds a client from a kubeconfig path, or the in-cluster / default configuration.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, kube::Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(kube::Error::InferKubeconfig)?
        }
        None => kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?,
    };
    Client::try_from(config)
}

/// What a watcher stream's events become.
trait Forward: Resource + Send + 'static {
    /// The converted form a listing buffers.
    type Entry: Send + 'static;
    fn convert(obj: &Self, default_algorithm: Algorithm) -> Self::Entry;
    fn apply(entry: Self::Entry) -> SourceEvent;
    fn delete(namespace: String, name: String) -> SourceEvent;
    fn replace(all: Vec<Self::Entry>) -> SourceEvent;
}

impl Forward for Service {
    type Entry = ServiceEntry;
    fn convert(obj: &Self, default_algorithm: Algorithm) -> ServiceEntry {
        ServiceEntry::new(obj, default_algorithm)
    }
    fn apply(entry: ServiceEntry) -> SourceEvent {
        SourceEvent::ApplyService(Box::new(entry))
    }
    fn delete(namespace: String, name: String) -> SourceEvent {
        SourceEvent::DeleteService { namespace, name }
    }
    fn replace(all: Vec<ServiceEntry>) -> SourceEvent {
        SourceEvent::ReplaceServices(all)
    }
}

impl Forward for EndpointSlice {
    type Entry = SliceEntry;
    fn convert(obj: &Self, _: Algorithm) -> SliceEntry {
        SliceEntry::new(obj)
    }
    fn apply(entry: SliceEntry) -> SourceEvent {
        SourceEvent::ApplySlice(Box::new(entry))
    }
    fn delete(namespace: String, name: String) -> SourceEvent {
        SourceEvent::DeleteSlice { namespace, name }
    }
    fn replace(all: Vec<SliceEntry>) -> SourceEvent {
        SourceEvent::ReplaceSlices(all)
    }
}

/// Forwards one watcher stream; sends `()` on `listed` after its first complete listing.
async fn forward<K, S>(
    stream: S,
    tx: mpsc::Sender<SourceEvent>,
    listed: mpsc::Sender<()>,
    default_algorithm: Algorithm,
) where
    K: Forward + ResourceExt,
    K::DynamicType: Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Option<Vec<K::Entry>> = None;
    let mut first = true;
    while let Some(ev) = stream.next().await {
        let out = match ev {
            Ok(Event::Init) => {
                buffer = Some(Vec::new());
                None
            }
            Ok(Event::InitApply(obj)) => {
                buffer
                    .get_or_insert_with(Vec::new)
                    .push(K::convert(&obj, default_algorithm));
                None
            }
            Ok(Event::InitDone) => {
                let mut all = buffer.take().unwrap_or_default();
                all.shrink_to_fit();
                Some(K::replace(all))
            }
            Ok(Event::Apply(obj)) => Some(K::apply(K::convert(&obj, default_algorithm))),
            Ok(Event::Delete(obj)) => Some(K::delete(
                obj.namespace().unwrap_or_default(),
                obj.name_any(),
            )),
            Err(e) => {
                tracing::warn!(kind = %K::kind(&Default::default()), "watch failed, retrying with backoff: {e}");
                None
            }
        };
        let Some(out) = out else { continue };
        let is_listing = matches!(
            out,
            SourceEvent::ReplaceServices(_) | SourceEvent::ReplaceSlices(_)
        );
        if tx.send(out).await.is_err() {
            return;
        }
        if is_listing && first {
            first = false;
            let _ = listed.send(()).await;
        }
    }
}

/// kube-proxy's primary node IPs of `node`: per family, the first InternalIP, else the first
/// ExternalIP (`utilnode.GetNodeHostIPs`), the Node's first address's family first.
pub fn primary_of(node: &Node) -> Vec<std::net::IpAddr> {
    let addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let of = |kind: &str| -> Vec<std::net::IpAddr> {
        addrs
            .iter()
            .filter(|a| a.type_ == kind)
            .filter_map(|a| a.address.parse().ok())
            .collect()
    };
    let (internal, external) = (of("InternalIP"), of("ExternalIP"));
    let mut out: Vec<std::net::IpAddr> = Vec::new();
    for ip in internal.iter().chain(&external) {
        if !out.iter().any(|o| o.is_ipv6() == ip.is_ipv6()) {
            out.push(*ip);
        }
    }
    out
}

/// [`primary_of`] the Node called `node_name`, read once (within 10 s).
pub async fn primary_node_ips(
    client: Client,
    node_name: &str,
) -> Result<Vec<std::net::IpAddr>, String> {
    let nodes = Api::<Node>::all(client);
    match tokio::time::timeout(std::time::Duration::from_secs(10), nodes.get(node_name)).await {
        Ok(Ok(node)) => Ok(primary_of(&node)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

/// The label topology hints are matched against.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Forwards the zone label of the Node called `node_name` whenever it changes. A node the agent
/// may not read (no RBAC for nodes) or that does not exist has no zone: hints are then ignored,
/// as kube-proxy ignores them on an unlabelled node. Never holds back the first sync.
async fn forward_zone(client: Client, node_name: String, tx: mpsc::Sender<SourceEvent>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let stream = watcher::watcher(Api::<Node>::all(client), config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let zone_of = |n: &Node| n.labels().get(ZONE_LABEL).cloned();
    let mut sent: Option<Option<String>> = None;
    let mut listed: Option<Option<String>> = None;
    let mut warned = false;
    while let Some(ev) = stream.next().await {
        let zone = match ev {
            Ok(Event::Init) => {
                listed = Some(None);
                continue;
            }
            Ok(Event::InitApply(n)) => {
                listed = Some(zone_of(&n));
                continue;
            }
            Ok(Event::InitDone) => listed.take().flatten(),
            Ok(Event::Apply(n)) => zone_of(&n),
            Ok(Event::Delete(_)) => None,
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::warn!(
                        node = %node_name,
                        "cannot watch this node's Node object, so topology hints are ignored \
                         (retrying): {e}"
                    );
                }
                continue;
            }
        };
        if sent.as_ref() != Some(&zone) {
            sent = Some(zone.clone());
            if tx.send(SourceEvent::NodeZone(zone)).await.is_err() {
                return;
            }
        }
    }
}

/// Runs the watchers until the receiver goes away. `Synced` is sent once Services and
/// EndpointSlices have listed. `default_algorithm` is the node's `--balance`, for Services that
/// do not choose their own; `node_name` the node whose zone topology hints are matched against.
pub async fn run(
    client: Client,
    tx: mpsc::Sender<SourceEvent>,
    default_algorithm: Algorithm,
    node_name: String,
) {
    tokio::spawn(forward_zone(client.clone(), node_name, tx.clone()));
    let (listed_tx, mut listed_rx) = mpsc::channel(2);
    let services = watcher(Api::<Service>::all(client.clone()));
    let slices = watcher(Api::<EndpointSlice>::all(client));
    let svc_task = tokio::spawn(forward(
        services,
        tx.clone(),
        listed_tx.clone(),
        default_algorithm,
    ));
    let slice_task = tokio::spawn(forward(slices, tx.clone(), listed_tx, default_algorithm));
    if listed_rx.recv().await.is_some() && listed_rx.recv().await.is_some() {
        let _ = tx.send(SourceEvent::Synced).await;
    }
    let _ = tokio::join!(svc_task, slice_task);
}

fn watcher<K>(api: Api<K>) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}
