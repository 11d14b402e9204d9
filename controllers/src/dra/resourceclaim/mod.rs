//! The resourceclaim controller (kube-controller-manager v1.34's `resourceclaim-controller`,
//! `pkg/controller/resourceclaim`): the ResourceClaims of Pods that use dynamic resource
//! allocation.
//!
//! - A Pod claim from a ResourceClaimTemplate gets its claim (`<pod>-<claim>-xxxxx`, controlled
//!   by the Pod, the template's labels and annotations and `resource.kubernetes.io/pod-claim-name`)
//!   and the Pod's `status.resourceClaimStatuses` records it (server-side apply, field manager
//!   `ResourceClaimController`). A template that cannot be read gives the Pod the Warning
//!   `FailedResourceClaimCreation`.
//! - A scheduled Pod is added to `status.reservedFor` of its allocated claims (the scheduler
//!   normally does it; this catches the Pods bound by someone else).
//! - A claim's reservations for Pods that are gone, replaced or done are dropped; with the last
//!   one the allocation is cleared and the scheduler's `resource.kubernetes.io/delete-protection`
//!   finalizer removed; a claim generated for a Pod that will not run is deleted.
//!
//! kpr's scheduler does not allocate devices (its DynamicResources plugin is not built:
//! docs/SCHEDULER.md), so on a cluster of kpr's scheduler DRA Pods stay unschedulable whatever
//! this controller does; with kube-scheduler it is what makes them schedulable.
//!
//! The decisions are [`plan`]'s; this module owns the queue (`pod:` and `claim:` keys, as
//! upstream), the API writes, the Event, the claims it made that the cache has not shown yet, and
//! the uids of Pods it saw deleted. Queue `resource_claim`, one worker.

pub mod plan;
#[cfg(test)]
mod plan_tests;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, split_key, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

use plan::{ClaimName, ClaimStep, Consumer};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "resourceclaim";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "resource_claim";

/// The Events' source, as upstream.
pub const EVENT_SOURCE: &str = "resource_claim";

/// The field manager of the Pod status it applies, as upstream.
pub const FIELD_MANAGER: &str = "ResourceClaimController";

/// How many deleted Pods' uids it remembers (upstream's `maxUIDCacheEntries`).
const DELETED_PODS: usize = 500;

const POD_CLAIMS: &str = "resourceclaim-pod-claims";
const CLAIM_OWNER: &str = "resourceclaim-owner-pod";

/// The Pod's claims whose names are known, as `namespace/name`.
fn pod_claim_keys(p: &CachedPod) -> Vec<String> {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    plan::pod_claims(p)
        .iter()
        .filter_map(|pc| match plan::claim_name(p, pc) {
            ClaimName::Named { name, .. } => Some(format!("{ns}/{name}")),
            _ => None,
        })
        .collect()
}

fn claim_owner(c: &ResourceClaim) -> Vec<String> {
    plan::owning_pod(c)
        .map(|(_, uid)| uid.to_string())
        .into_iter()
        .collect()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CreateLabels {
    status: String,
    admin_access: String,
}

/// `resourceclaim_controller_creates_total{status, admin_access}`.
fn creates() -> &'static Family<CreateLabels, Counter> {
    static METRIC: OnceLock<Family<CreateLabels, Counter>> = OnceLock::new();
    METRIC.get_or_init(|| {
        let f = Family::default();
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "resourceclaim_controller_creates",
                "Number of ResourceClaims creation requests, categorized by creation status and admin access",
                f.clone(),
            );
        });
        f
    })
}

fn admin_access(claim: &ResourceClaim) -> bool {
    claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .any(|r| r.exactly.as_ref().and_then(|e| e.admin_access) == Some(true))
}

#[derive(Default)]
struct Memory {
    /// Claims created and not yet in the cache, by owning Pod uid (upstream's mutation cache:
    /// a retry before the cache catches up finds them instead of making another).
    created: HashMap<String, Vec<Arc<ResourceClaim>>>,
    /// The uids of Pods seen deleted, oldest first.
    deleted: VecDeque<String>,
}

/// The running controller.
pub struct Controller {
    client: Client,
    pods: Arc<Indexed<CachedPod>>,
    claims: Arc<Indexed<ResourceClaim>>,
    templates: Arc<Indexed<ResourceClaimTemplate>>,
    recorder: Recorder,
    queue: Arc<WorkQueue<String>>,
    memory: Mutex<Memory>,
}

impl Controller {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(POD_CLAIMS, pod_claim_keys);
        let claim_informer = informers.get::<ResourceClaim>();
        claim_informer.add_index(CLAIM_OWNER, claim_owner);
        let template_informer = informers.get::<ResourceClaimTemplate>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), EVENT_SOURCE),
            client,
            pods: pod_informer.cache(),
            claims: claim_informer.cache(),
            templates: template_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            memory: Mutex::new(Memory::default()),
        });
        creates();
        pod_informer.on_change_of(&this, |c, old, new| match (old, new) {
            (_, Some(p)) => c.enqueue_pod(p, false),
            (Some(p), None) => c.enqueue_pod(p, true),
            (None, None) => {}
        });
        claim_informer.on_change_of(&this, |c, old, new| {
            let Some(claim) = new.or(old) else { return };
            let key = key_of(&**claim);
            if let Some(claim) = new {
                // Seen in the cache: no longer one of the controller's unseen creations.
                if let Some((_, uid)) = plan::owning_pod(claim) {
                    let mut memory = c.memory.lock().expect("resourceclaim memory");
                    if let Some(list) = memory.created.get_mut(uid) {
                        list.retain(|x| x.metadata.name != claim.metadata.name);
                        if list.is_empty() {
                            memory.created.remove(uid);
                        }
                    }
                }
                c.queue.add(format!("claim:{key}"));
            }
            for p in c.pods.index(POD_CLAIMS, &key) {
                c.enqueue_pod(&p, false);
            }
        });
        this
    }

    /// Upstream's `enqueuePod`: the claims of a Pod that is gone or will not run, and the Pod
    /// itself when it needs work.
    fn enqueue_pod(&self, pod: &CachedPod, deleted: bool) {
        let claims = plan::pod_claims(pod);
        if claims.is_empty() {
            return;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        if deleted {
            let mut memory = self.memory.lock().expect("resourceclaim memory");
            memory
                .deleted
                .push_back(pod.metadata.uid.clone().unwrap_or_default());
            while memory.deleted.len() > DELETED_PODS {
                memory.deleted.pop_front();
            }
        }
        // Gone, finished, or deleted before it was scheduled: its claims may be released.
        if deleted || plan::is_pod_done(pod) {
            for key in pod_claim_keys(pod) {
                self.queue.add(format!("claim:{key}"));
            }
        }
        if !deleted && self.pod_needs_work(pod) {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            self.queue.add(format!("pod:{ns}/{name}"));
        }
    }

    /// Upstream's `podNeedsWork`.
    fn pod_needs_work(&self, pod: &CachedPod) -> bool {
        if pod.metadata.deletion_timestamp.is_some() {
            return false;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let scheduled = pod.node_name().is_some();
        for pc in plan::pod_claims(pod) {
            let (name, check_owner) = match plan::claim_name(pod, pc) {
                ClaimName::Named { name, check_owner } => (name, check_owner),
                ClaimName::NotNeeded => return false,
                ClaimName::NotCreated | ClaimName::Unsupported => return true,
            };
            let Some(claim) = self.claims.get(ns, &name) else {
                // A template's claim to make again; a user's claim is the user's to make.
                return pc.resource_claim_template_name.is_some();
            };
            if check_owner && plan::is_for_pod(pod, &claim).is_err() {
                return false;
            }
            if !scheduled {
                continue;
            }
            let allocated = claim
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some());
            if allocated && !plan::is_reserved_for(pod, &claim) {
                return true;
            }
        }
        false
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.pods, &*self.claims, &*self.templates],
            &self.queue,
            1,
        )
        .await;
    }

    async fn sync_pod(&self, ns: &str, name: &str) -> Result<()> {
        let Some(pod) = self.pods.get(ns, name) else {
            return Ok(());
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let claim = |n: &str| self.claims.get(ns, n);
        let mut recorded: Vec<(String, String)> = Vec::new();
        let claims_api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        for pc in plan::pod_claims(&pod) {
            let mut generated = self.claims.index(CLAIM_OWNER, &uid);
            generated.extend(
                self.memory
                    .lock()
                    .expect("resourceclaim memory")
                    .created
                    .get(&uid)
                    .cloned()
                    .unwrap_or_default(),
            );
            let step = plan::claim_step(&pod, pc, &claim, &generated);
            let outcome = match step {
                ClaimStep::Ready => Ok(()),
                ClaimStep::Record { claim } => {
                    recorded.push((pc.name.clone(), claim));
                    Ok(())
                }
                ClaimStep::Fail(e) => Err(e),
                ClaimStep::Create { template } => match self.templates.get(ns, &template) {
                    None => Err(format!(
                        "resource claim template {template:?}: \
                         resourceclaimtemplate.resource.k8s.io {template:?} not found"
                    )),
                    Some(t) => {
                        let new = plan::claim_from_template(&pod, pc, &t);
                        let labels = CreateLabels {
                            status: String::new(),
                            admin_access: admin_access(&new).to_string(),
                        };
                        match claims_api.create(&PostParams::default(), &new).await {
                            Ok(made) => {
                                creates()
                                    .get_or_create(&CreateLabels {
                                        status: "success".into(),
                                        ..labels
                                    })
                                    .inc();
                                tracing::info!(
                                    controller = NAME,
                                    pod = %format!("{ns}/{name}"),
                                    claim = made.metadata.name.as_deref().unwrap_or_default(),
                                    "created ResourceClaim"
                                );
                                recorded.push((
                                    pc.name.clone(),
                                    made.metadata.name.clone().unwrap_or_default(),
                                ));
                                self.memory
                                    .lock()
                                    .expect("resourceclaim memory")
                                    .created
                                    .entry(uid.clone())
                                    .or_default()
                                    .push(Arc::new(made));
                                Ok(())
                            }
                            Err(e) => {
                                creates()
                                    .get_or_create(&CreateLabels {
                                        status: "failure".into(),
                                        ..labels
                                    })
                                    .inc();
                                Err(format!(
                                    "create ResourceClaim {}: {}",
                                    new.metadata.generate_name.as_deref().unwrap_or_default(),
                                    apierrors::api_message(&e)
                                ))
                            }
                        }
                    }
                },
            };
            if let Err(e) = outcome {
                let regarding = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(ns.to_string()),
                    name: Some(name.to_string()),
                    uid: Some(uid.clone()),
                    ..Default::default()
                };
                self.recorder.publish(
                    &regarding,
                    true,
                    "FailedResourceClaimCreation",
                    format!("PodResourceClaim {}: {e}", pc.name),
                );
                return Err(Error::Invalid {
                    object: format!("Pod {ns}/{name}"),
                    reason: format!("PodResourceClaim {}: {e}", pc.name),
                });
            }
        }
        if !recorded.is_empty() {
            recorded.sort();
            let statuses: Vec<_> = recorded
                .iter()
                .map(|(pc, claim)| json!({"name": pc, "resourceClaimName": claim}))
                .collect();
            let apply = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns},
                "status": {"resourceClaimStatuses": statuses},
            });
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            pods.patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&apply),
            )
            .await
            .map_err(|e| {
                Error::kube(
                    "recording the ResourceClaims of",
                    format!("Pod {ns}/{name}"),
                    e,
                )
            })?;
        }
        if pod.node_name().is_none() {
            // The scheduler reserves the claims of the Pods it binds.
            return Ok(());
        }
        let reserve = plan::to_reserve(&pod, &claim).map_err(|reason| Error::Invalid {
            object: format!("Pod {ns}/{name}"),
            reason,
        })?;
        for c in reserve {
            let mut c = (*c).clone();
            c.status
                .get_or_insert_with(Default::default)
                .reserved_for
                .get_or_insert_with(Vec::new)
                .push(
                    k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".into(),
                        name: name.to_string(),
                        uid: uid.clone(),
                    },
                );
            let cname = c.metadata.name.clone().unwrap_or_default();
            claims_api
                .replace_status(&cname, &PostParams::default(), &c)
                .await
                .map_err(|e| {
                    Error::kube(
                        "reserving for its Pod",
                        format!("ResourceClaim {ns}/{cname}"),
                        e,
                    )
                })?;
        }
        Ok(())
    }

    /// Whether a Pod reserved in a claim still counts.
    async fn consumer(&self, ns: &str, name: &str, uid: &str) -> Result<Consumer> {
        let known_deleted = self
            .memory
            .lock()
            .expect("resourceclaim memory")
            .deleted
            .iter()
            .any(|u| u == uid);
        if known_deleted {
            return Ok(Consumer::Gone);
        }
        match self.pods.get(ns, name) {
            Some(p) if p.metadata.uid.as_deref() != Some(uid) || plan::is_pod_done(&p) => {
                Ok(Consumer::Gone)
            }
            Some(_) => Ok(Consumer::Running),
            None => {
                // Not seen yet: the scheduler may be binding it this moment. Only the API
                // server can say it is gone.
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let live = pods
                    .get_opt(name)
                    .await
                    .map_err(|e| Error::kube("reading", format!("Pod {ns}/{name}"), e))?;
                Ok(match live {
                    Some(p) if p.metadata.uid.as_deref() == Some(uid) => Consumer::Running,
                    _ => Consumer::Gone,
                })
            }
        }
    }

    async fn sync_claim(&self, ns: &str, name: &str) -> Result<()> {
        let Some(claim) = self.claims.get(ns, name) else {
            return Ok(());
        };
        let mut verdicts = HashMap::new();
        for r in claim
            .status
            .iter()
            .flat_map(|s| s.reserved_for.iter().flatten())
        {
            if r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty() {
                verdicts.insert(r.uid.clone(), self.consumer(ns, &r.name, &r.uid).await?);
            }
        }
        let owner = plan::owning_pod(&claim).map(|(pod, uid)| {
            self.pods
                .get(ns, pod)
                .map(|p| p.metadata.uid.as_deref() != Some(uid) || plan::is_pod_done(&p))
        });
        let consumer = |_: &str, uid: &str| verdicts.get(uid).copied().unwrap_or(Consumer::Gone);
        let plan = plan::claim_plan(&claim, &consumer, owner).map_err(|reason| Error::Invalid {
            object: format!("ResourceClaim {ns}/{name}"),
            reason,
        })?;
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        let mut current = (*claim).clone();
        if plan.reserved_for.is_some() || plan.deallocate {
            let status = current.status.get_or_insert_with(Default::default);
            if let Some(valid) = plan.reserved_for.clone() {
                status.reserved_for = Some(valid).filter(|v| !v.is_empty());
            }
            if plan.deallocate {
                status.allocation = None;
            }
            current = api
                .replace_status(name, &PostParams::default(), &current)
                .await
                .map_err(|e| {
                    Error::kube(
                        "updating the reservations of",
                        format!("ResourceClaim {ns}/{name}"),
                        e,
                    )
                })?;
        }
        let still_allocated = current
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some());
        if plan.remove_finalizer && !still_allocated {
            if let Some(f) = current.metadata.finalizers.as_mut() {
                f.retain(|x| x != plan::FINALIZER);
            }
            current = api
                .replace(name, &PostParams::default(), &current)
                .await
                .map_err(|e| {
                    Error::kube(
                        "removing the finalizer of",
                        format!("ResourceClaim {ns}/{name}"),
                        e,
                    )
                })?;
        }
        let _ = current;
        if plan.delete {
            tracing::info!(
                controller = NAME,
                claim = %format!("{ns}/{name}"),
                "deleting unused generated claim"
            );
            match api.delete(name, &Default::default()).await {
                Ok(_) => {}
                Err(e) if apierrors::is_not_found(&e) => {}
                Err(e) => {
                    return Err(Error::kube(
                        "deleting",
                        format!("ResourceClaim {ns}/{name}"),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }
}

impl SyncKey for Controller {
    async fn sync(&self, key: &str) -> Result<()> {
        let (kind, object) = key.split_once(':').unwrap_or(("", key));
        let (ns, name) = split_key(object);
        match kind {
            "pod" => self.sync_pod(ns, name).await,
            "claim" => self.sync_claim(ns, name).await,
            _ => Err(Error::Invalid {
                object: key.to_string(),
                reason: "unexpected key prefix".into(),
            }),
        }
    }
}
