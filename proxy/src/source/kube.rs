//! The `kube` source: kube-rs watchers on Services and EndpointSlices.
//!
//! Each watcher's (re)list is forwarded as one complete listing (`Replace*`), so objects deleted while
//! the watch was down are deleted here too; single events are forwarded as they come. When the API
//! server goes away the watchers back off and retry; nothing is torn down meanwhile: the last
//! programmed state keeps serving.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;

use super::SourceEvent;

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
trait Forward: Resource + Clone + Send + 'static {
    fn apply(obj: Self) -> SourceEvent;
    fn delete(namespace: String, name: String) -> SourceEvent;
    fn replace(all: Vec<Self>) -> SourceEvent;
}

impl Forward for Service {
    fn apply(obj: Self) -> SourceEvent {
        SourceEvent::ApplyService(Box::new(obj))
    }
    fn delete(namespace: String, name: String) -> SourceEvent {
        SourceEvent::DeleteService { namespace, name }
    }
    fn replace(all: Vec<Self>) -> SourceEvent {
        SourceEvent::ReplaceServices(all)
    }
}

impl Forward for EndpointSlice {
    fn apply(obj: Self) -> SourceEvent {
        SourceEvent::ApplySlice(Box::new(obj))
    }
    fn delete(namespace: String, name: String) -> SourceEvent {
        SourceEvent::DeleteSlice { namespace, name }
    }
    fn replace(all: Vec<Self>) -> SourceEvent {
        SourceEvent::ReplaceSlices(all)
    }
}

/// Forwards one watcher stream; sends `()` on `listed` after its first complete listing.
async fn forward<K, S>(stream: S, tx: mpsc::Sender<SourceEvent>, listed: mpsc::Sender<()>)
where
    K: Forward + ResourceExt,
    K::DynamicType: Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Option<Vec<K>> = None;
    let mut first = true;
    while let Some(ev) = stream.next().await {
        let out = match ev {
            Ok(Event::Init) => {
                buffer = Some(Vec::new());
                None
            }
            Ok(Event::InitApply(obj)) => {
                buffer.get_or_insert_with(Vec::new).push(obj);
                None
            }
            Ok(Event::InitDone) => Some(K::replace(buffer.take().unwrap_or_default())),
            Ok(Event::Apply(obj)) => Some(K::apply(obj)),
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

/// Runs both watchers until the receiver goes away. `Synced` is sent once both have listed.
pub async fn run(client: Client, tx: mpsc::Sender<SourceEvent>) {
    let (listed_tx, mut listed_rx) = mpsc::channel(2);
    let services = watcher(Api::<Service>::all(client.clone()));
    let slices = watcher(Api::<EndpointSlice>::all(client));
    let svc_task = tokio::spawn(forward(services, tx.clone(), listed_tx.clone()));
    let slice_task = tokio::spawn(forward(slices, tx.clone(), listed_tx));
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
