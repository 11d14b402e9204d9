//! The horizontal Pod autoscaler (kube-controller-manager v1.34's `horizontalpodautoscaling`
//! controller, autoscaling/v2): every `--horizontal-pod-autoscaler-sync-period` (15 s) per
//! HorizontalPodAutoscaler, reads its target's scale subresource (any scalable resource:
//! Deployments, ReplicaSets, StatefulSets, ReplicationControllers, custom resources with a scale
//! subresource), the Pods the scale's selector selects and their usage from the resource metrics
//! API (`metrics.k8s.io/v1beta1` PodMetrics through the API server's aggregation), computes the
//! replica count ([`replicas`]), stabilises and limits it ([`normalize`]), writes the scale and
//! the autoscaler's status with upstream's conditions and Events ([`plan`]).
//!
//! Owns: the target's `spec.replicas` through `/scale`, the HPA's status, its Events (source
//! `horizontal-pod-autoscaler`) and its in-memory recommendation and scale-event history. Must
//! not touch: anything else. Metric sources Pods, Object and External (custom and external
//! metrics APIs) are reported as invalid metrics naming the field; without metrics.k8s.io the
//! autoscaler reports ScalingActive False (FailedGetResourceMetric) and never scales.
//!
//! Runs on the shared runtime: the HPA informer (whose adds and updates queue the HPA after one
//! period, as upstream's rate-limited add with its fixed-interval limiter) and the Pod cache; one
//! work queue `horizontalpodautoscaler` with `--concurrent-horizontal-pod-autoscaler-syncs`
//! workers; each sync queues the HPA again one period later.

pub mod metrics;
pub mod normalize;
pub mod plan;
pub mod replicas;
pub mod scale;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::is_conflict;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, split_key, Informers, NAMESPACE};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

use normalize::History;
use plan::{Inputs, Outcome, ScaleView, Settings};

/// The controller's name in logs (the name `--controllers` takes).
pub const NAME: &str = "horizontalpodautoscaling";

/// Its work queue's (and metrics') name, as upstream.
pub const QUEUE_NAME: &str = "horizontalpodautoscaler";

/// The Events' source component, as upstream.
pub const COMPONENT: &str = "horizontal-pod-autoscaler";

/// The controller's settings (kube-controller-manager's flags).
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// `--concurrent-horizontal-pod-autoscaler-syncs` (5).
    pub workers: usize,
    /// `--horizontal-pod-autoscaler-sync-period` (15 s).
    pub sync_period: Duration,
    /// The tolerance, stabilisation and readiness flags.
    pub settings: Settings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 5,
            sync_period: Duration::from_secs(15),
            settings: Settings {
                tolerance: 0.1,
                downscale_stabilization: Duration::from_secs(300),
                cpu_initialization_period: Duration::from_secs(300),
                initial_readiness_delay: Duration::from_secs(30),
            },
        }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    hpas: Arc<Indexed<HorizontalPodAutoscaler>>,
    pods: Arc<Indexed<CachedPod>>,
    queue: Arc<WorkQueue<String>>,
    recorder: Recorder,
    resolver: scale::Resolver,
    /// Each autoscaler's recommendations and scale events.
    histories: Mutex<HashMap<String, History>>,
    /// Each known autoscaler's last parsed selector (`None`: not yet known, selects nothing),
    /// for upstream's check that no two autoscalers control the same Pods.
    selectors: Mutex<HashMap<String, Option<Selector>>>,
}

impl Controller {
    /// Registers on the HPA informer and takes the Pod cache.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let hpa_informer = informers.get::<HorizontalPodAutoscaler>();
        let c = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), COMPONENT),
            client,
            config,
            hpas: hpa_informer.cache(),
            pods: informers.get::<CachedPod>().cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            resolver: scale::Resolver::default(),
            histories: Mutex::new(HashMap::new()),
            selectors: Mutex::new(HashMap::new()),
        });
        hpa_informer.on_change_of(&c, Controller::on_hpa);
        c
    }

    fn on_hpa(
        &self,
        _old: Option<&Arc<HorizontalPodAutoscaler>>,
        new: Option<&Arc<HorizontalPodAutoscaler>>,
    ) {
        let Some(hpa) = new else {
            // Deleted: the sync finds it gone and forgets it.
            return;
        };
        let key = key_of(hpa.as_ref());
        self.selectors
            .lock()
            .expect("selectors lock")
            .entry(key.clone())
            .or_insert(None);
        self.queue.add_coalesced(key, self.config.sync_period);
    }

    /// Waits for the caches, then syncs the queued autoscalers.
    pub async fn run(self: Arc<Self>) {
        let queue = self.queue.clone();
        let workers = self.config.workers;
        run_controller(&self, NAME, &[&*self.hpas, &*self.pods], &queue, workers).await;
    }
}

impl SyncKey for Controller {
    /// One sync of the autoscaler `key` ("namespace/name"); queues it again one period later
    /// unless it is gone. Errors are logged, not retried sooner, as upstream.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let Some(hpa) = self.hpas.get(ns, name) else {
            tracing::info!(hpa = key, "Horizontal Pod Autoscaler has been deleted");
            self.histories.lock().expect("histories lock").remove(key);
            self.selectors.lock().expect("selectors lock").remove(key);
            return Ok(());
        };
        if let Err(e) = self.reconcile(&hpa, key).await {
            tracing::warn!(hpa = key, "{e}");
        }
        self.queue
            .add_coalesced(key.to_string(), self.config.sync_period);
        Ok(())
    }
}

impl Controller {
    async fn reconcile(&self, hpa: &HorizontalPodAutoscaler, key: &str) -> Result<()> {
        let (ns, name) = split_key(key);
        let target = hpa
            .spec
            .as_ref()
            .map(|s| s.scale_target_ref.clone())
            .unwrap_or_default();
        let reference = format!("{}/{ns}/{}", target.kind, target.name);
        let resolved = match &target.api_version {
            Some(v) => self.resolver.resolve(&self.client, v, &target.kind).await,
            None => Err("the scale target reference has no apiVersion".to_string()),
        };
        let got = match resolved {
            Ok(ar) => scale::get(&self.client, &ar, ns, &target.name)
                .await
                .map(|s| (ar, s)),
            Err(e) => Err(e),
        };
        let (ar, current_scale) = match got {
            Ok(x) => x,
            Err(e) => {
                let outcome = plan::failed_get_scale(hpa, &e, Timestamp::now());
                self.finish(hpa, outcome).await?;
                return Err(Error::Invalid {
                    object: format!("HorizontalPodAutoscaler {key}"),
                    reason: format!("failed to query scale subresource for {reference}: {e}"),
                });
            }
        };
        let view = ScaleView {
            replicas: current_scale
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(0),
            selector: current_scale
                .status
                .as_ref()
                .and_then(|s| s.selector.clone())
                .unwrap_or_default(),
        };
        let metrics = if plan::needs_metrics(hpa, &view) && !view.selector.is_empty() {
            Some(metrics::list(&self.client, ns, &view.selector).await)
        } else {
            None
        };
        let mut outcome = {
            let pods = self.pods.index(NAMESPACE, ns);
            let pod_refs: Vec<&CachedPod> = pods.iter().map(|p| p.as_ref()).collect();
            let selecting = |selected: &[&CachedPod]| self.selecting_hpas(key, &view, selected);
            let inputs = Inputs {
                pods: &pod_refs,
                metrics: metrics.as_ref(),
                selecting: &selecting,
            };
            let mut histories = self.histories.lock().expect("histories lock");
            let history = histories.entry(key.to_string()).or_default();
            plan::plan(
                hpa,
                &view,
                &inputs,
                history,
                &self.config.settings,
                Timestamp::now(),
            )
        };
        if let Some(r) = outcome.rescale.clone() {
            let result = self.write_scale(&ar, ns, current_scale, r.desired).await;
            if result.is_ok() {
                tracing::info!(
                    hpa = key,
                    current = r.current,
                    desired = r.desired,
                    reason = r.reason,
                    "Successfully rescaled"
                );
            }
            let mut histories = self.histories.lock().expect("histories lock");
            let history = histories.entry(key.to_string()).or_default();
            plan::rescaled(
                hpa,
                &mut outcome,
                result.map_err(|e| scale::message(&e)),
                history,
                &self.config.settings,
                Timestamp::now(),
            );
        }
        let error = outcome.error.clone();
        self.finish(hpa, outcome).await?;
        let _ = name;
        match error {
            Some(e) => Err(Error::Invalid {
                object: format!("HorizontalPodAutoscaler {key}"),
                reason: e,
            }),
            None => Ok(()),
        }
    }

    /// Keys of the autoscalers whose last selector matches one of `pods`, this one's selector
    /// recorded first (upstream's `hpaSelectors` bimultimap).
    fn selecting_hpas(&self, key: &str, view: &ScaleView, pods: &[&CachedPod]) -> Vec<String> {
        let mut selectors = self.selectors.lock().expect("selectors lock");
        if let (Some(slot), Ok(parsed)) = (
            selectors.get_mut(key),
            Selector::parse_string(&view.selector),
        ) {
            *slot = Some(parsed);
        }
        let (ns, _) = split_key(key);
        let mut out: Vec<String> = selectors
            .iter()
            .filter(|(k, _)| split_key(k).0 == ns)
            .filter(|(_, s)| {
                s.as_ref()
                    .is_some_and(|s| pods.iter().any(|p| s.matches(p.metadata.labels.as_ref())))
            })
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }

    /// Writes the scale, re-reading it on a conflict (client-go's `RetryOnConflict`, 5 tries).
    async fn write_scale(
        &self,
        ar: &kube::api::ApiResource,
        ns: &str,
        mut current: k8s_openapi::api::autoscaling::v1::Scale,
        desired: i32,
    ) -> std::result::Result<(), kube::Error> {
        let name = current.metadata.name.clone().unwrap_or_default();
        let mut attempt = 0;
        loop {
            current.spec.get_or_insert_with(Default::default).replicas = Some(desired);
            match scale::update(&self.client, ar, ns, &current).await {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) && attempt < 4 => {
                    attempt += 1;
                    if let Ok(latest) = scale::get(&self.client, ar, ns, &name).await {
                        current = latest;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Records the Events and writes the status when it changed (upstream's
    /// `updateStatusIfNeeded`).
    async fn finish(&self, hpa: &HorizontalPodAutoscaler, outcome: Outcome) -> Result<()> {
        let reference = object_reference(hpa);
        for e in &outcome.events {
            self.recorder
                .publish(&reference, e.warning, &e.reason, e.message.clone());
        }
        if hpa.status.as_ref() == Some(&outcome.status) {
            return Ok(());
        }
        let ns = hpa.metadata.namespace.clone().unwrap_or_default();
        let name = hpa.metadata.name.clone().unwrap_or_default();
        let mut updated = hpa.clone();
        updated.status = Some(outcome.status);
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = api
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            self.recorder
                .publish(&reference, true, "FailedUpdateStatus", scale::message(&e));
            return Err(Error::kube(
                "updating the status of",
                format!("HorizontalPodAutoscaler {ns}/{name}"),
                e,
            ));
        }
        Ok(())
    }
}

/// The autoscaler as its Events name it.
fn object_reference(hpa: &HorizontalPodAutoscaler) -> ObjectReference {
    ObjectReference {
        api_version: Some("autoscaling/v2".to_string()),
        kind: Some("HorizontalPodAutoscaler".to_string()),
        name: hpa.metadata.name.clone(),
        namespace: hpa.metadata.namespace.clone(),
        uid: hpa.metadata.uid.clone(),
        resource_version: hpa.metadata.resource_version.clone(),
        ..Default::default()
    }
}
