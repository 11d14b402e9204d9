//! The attach/detach controller (kube-controller-manager v1.34's
//! `persistentvolume-attach-detach-controller`, `pkg/controller/volume/attachdetach`): the
//! volumes of the Pods scheduled to a node are attached to it before kubelet mounts them, and
//! detached once no Pod there uses them and kubelet has unmounted them.
//!
//! For a CSI volume (the only kind v1.34 attaches from the controller: every in-tree attachable
//! plugin is migrated to CSI) attaching is a VolumeAttachment named as the CSI attacher names it,
//! which the driver's external-attacher acts on and marks `status.attached`; the controller then
//! lists the volume in the node's `status.volumesAttached`, which kubelet waits for before it
//! mounts. Detaching deletes the VolumeAttachment, after taking the volume out of
//! `volumesAttached` and while kubelet no longer lists it in `volumesInUse` (or after six
//! minutes of waiting, a forced detach, as upstream).
//!
//! Only nodes whose kubelet leaves attaching to the controller (the
//! `volumes.kubernetes.io/controller-managed-attach-detach` annotation) are handled. A driver
//! whose CSIDriver says `attachRequired: false` is not attached. A volume that allows a single
//! node (ReadWriteOnce, ReadWriteOncePod) is not attached to a second node while the first has
//! it: the Pods get the Multi-Attach Event.
//!
//! Not built: in-tree volume sources migrated to CSI (a PersistentVolume with
//! `gcePersistentDisk`, `awsElasticBlockStore`, ...: their attachment needs csi-translation-lib's
//! translation of the handle; such a volume is not attached, and docs/VOLUMES.md says so), and
//! inline CSI volumes in a Pod (never attachable). The state is derived from the API's objects
//! on each pass; the VolumeAttachments it answers for are those there when it started (so a
//! restarted controller picks up where the last one was, as upstream imports them), those it
//! made and those its Pods want: one someone else makes later is left alone, as upstream leaves
//! it (upstream's Conformance spec of the VolumeAttachment API makes such ones).
//!
//! The decision is [`plan`], pure; this module owns the informers' wiring, the node queue, the
//! API writes, the Events and the detach timers. Queue `attachdetach`, one key per node.

pub mod plan;
#[cfg(test)]
mod plan_tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{key_of, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

use plan::{Detach, NodeState, Waiting, Wanted};

/// The controller's name (`--controllers`, logs).
pub const NAME: &str = "persistentvolume-attach-detach";

/// The work queue's name (upstream's controller runs loops rather than a queue).
pub const QUEUE_NAME: &str = "attachdetach";

/// The Events' source, as upstream's recorder names it.
pub const EVENT_SOURCE: &str = "attachdetach-controller";

/// The Pod cache's index of Pods by their node.
const POD_NODE: &str = "attachdetach-pod-node";
/// The VolumeAttachment cache's indexes: by node, by PersistentVolume.
const VA_NODE: &str = "attachdetach-va-node";
const VA_PV: &str = "attachdetach-va-pv";

fn pod_node(p: &CachedPod) -> Vec<String> {
    if p.volume_claims().next().is_none() {
        return Vec::new();
    }
    p.node_name().map(str::to_string).into_iter().collect()
}

fn va_node(a: &VolumeAttachment) -> Vec<String> {
    if a.spec.source.persistent_volume_name.is_none() {
        return Vec::new();
    }
    vec![a.spec.node_name.clone()]
}

fn va_pv(a: &VolumeAttachment) -> Vec<String> {
    a.spec
        .source
        .persistent_volume_name
        .clone()
        .into_iter()
        .collect()
}

/// `attachdetach_controller_forced_detaches`: detaches made while kubelet still reported the
/// volume in use, after [`plan::MAX_WAIT_FOR_UNMOUNT`].
fn forced_detaches() -> &'static Counter {
    static METRIC: OnceLock<Counter> = OnceLock::new();
    METRIC.get_or_init(|| {
        let c = Counter::default();
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "attachdetach_controller_forced_detaches",
                "Number of times the A/D Controller performed a forced detach",
                c.clone(),
            );
        });
        c
    })
}

/// What the controller remembers between passes over a node (none of it needed after a
/// restart: it is either re-derived or only spares a repeated Event).
#[derive(Default)]
struct Memory {
    /// Per node, what each Pod volume resolved to last (`<pod uid>/<volume>`).
    resolved: HashMap<String, BTreeMap<String, Wanted>>,
    /// Per node, its desired volumes with their Pods (by PersistentVolume).
    desired: HashMap<String, BTreeMap<String, Wanted>>,
    /// Per node, the claims and volumes its Pods wait for.
    waiting: HashMap<String, BTreeSet<Waiting>>,
    /// Per node, the volumes held back by another node's exclusive attachment.
    blocked: HashMap<String, BTreeSet<String>>,
    /// Per node, the attachments made since it last changed ([`NodeState::assumed_mounted`]).
    assumed_mounted: HashMap<String, BTreeSet<String>>,
    /// When each attachment was first found no longer wanted.
    undesired_since: HashMap<String, Instant>,
    /// The VolumeAttachments this controller answers for (upstream's actual state): those there
    /// when it started, those it made, and those it found wanted. One made by someone else
    /// later (a test's, another tool's) is left alone, as upstream leaves it.
    owned: HashSet<String>,
    /// Whether `owned` holds the attachments there at the start.
    seeded: bool,
    /// The Events already told ([`plan::PodEvent::once_key`]).
    told: HashSet<String>,
}

/// The running controller.
pub struct Controller {
    client: Client,
    nodes: Arc<Indexed<Node>>,
    pods: Arc<Indexed<CachedPod>>,
    claims: Arc<Indexed<PersistentVolumeClaim>>,
    volumes: Arc<Indexed<PersistentVolume>>,
    drivers: Arc<Indexed<CSIDriver>>,
    attachments: Arc<Indexed<VolumeAttachment>>,
    recorder: Recorder,
    queue: Arc<WorkQueue<String>>,
    memory: Mutex<Memory>,
}

struct CacheLookup<'a>(&'a Controller);

impl plan::Lookup for CacheLookup<'_> {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.0.claims.get(namespace, name)
    }
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.0.volumes.get("", name)
    }
    fn attach_required(&self, driver: &str) -> bool {
        self.0
            .drivers
            .get("", driver)
            .and_then(|d| d.spec.attach_required)
            .unwrap_or(true)
    }
}

fn node_state(node: Option<&Node>) -> NodeState {
    let Some(node) = node else {
        return NodeState::default();
    };
    let status = node.status.as_ref();
    NodeState {
        exists: true,
        managed: node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(plan::ANN_CONTROLLER_MANAGED))
            .is_some_and(|v| v == "true"),
        reported: status
            .and_then(|s| s.volumes_attached.as_ref())
            .into_iter()
            .flatten()
            .map(|v| v.name.clone())
            .collect(),
        in_use: status
            .and_then(|s| s.volumes_in_use.clone())
            .into_iter()
            .flatten()
            .collect(),
        assumed_mounted: BTreeSet::new(),
    }
}

impl Controller {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let pod_informer = informers.get::<CachedPod>();
        pod_informer.add_index(POD_NODE, pod_node);
        let va_informer = informers.get::<VolumeAttachment>();
        va_informer.add_index(VA_NODE, va_node);
        va_informer.add_index(VA_PV, va_pv);
        let node_informer = informers.get::<Node>();
        let pvc_informer = informers.get::<PersistentVolumeClaim>();
        let pv_informer = informers.get::<PersistentVolume>();
        let driver_informer = informers.get::<CSIDriver>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), EVENT_SOURCE),
            client,
            nodes: node_informer.cache(),
            pods: pod_informer.cache(),
            claims: pvc_informer.cache(),
            volumes: pv_informer.cache(),
            drivers: driver_informer.cache(),
            attachments: va_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            memory: Mutex::new(Memory::default()),
        });
        forced_detaches();
        pod_informer.on_change_of(&this, |c, old, new| {
            let nodes: BTreeSet<String> = old
                .into_iter()
                .chain(new)
                .flat_map(|p| pod_node(p))
                .collect();
            for n in nodes {
                c.queue.add(n);
            }
        });
        node_informer.on_change_of(&this, |c, old, new| {
            // Any change of the Node is a fresh volumesInUse: what was taken as mounted is now
            // what kubelet says.
            let name = new.or(old).and_then(|n| n.metadata.name.clone());
            let had_assumed = name.as_ref().is_some_and(|n| {
                c.memory
                    .lock()
                    .expect("attachdetach memory")
                    .assumed_mounted
                    .remove(n)
                    .is_some_and(|a| !a.is_empty())
            });
            let relevant = had_assumed
                || match (old, new) {
                    (Some(o), Some(n)) => {
                        let (o, n) = (node_state(Some(o)), node_state(Some(n)));
                        o.managed != n.managed || o.in_use != n.in_use || o.reported != n.reported
                    }
                    _ => true,
                };
            if let Some(n) = new.or(old).filter(|_| relevant) {
                c.queue.add(n.metadata.name.clone().unwrap_or_default());
            }
        });
        va_informer.on_change_of(&this, |c, old, new| {
            let Some(a) = new.or(old) else { return };
            c.queue.add(a.spec.node_name.clone());
            if new.is_none() {
                // A volume held exclusively elsewhere may attach now.
                let pv = a.spec.source.persistent_volume_name.clone();
                let name = a.metadata.name.clone().unwrap_or_default();
                let mut memory = c.memory.lock().expect("attachdetach memory");
                memory.undesired_since.remove(&name);
                memory.owned.remove(&name);
                memory.told.retain(|k| !k.starts_with(&format!("{name}/")));
                let blocked: Vec<String> = memory
                    .blocked
                    .iter()
                    .filter(|(_, pvs)| pv.as_ref().is_some_and(|pv| pvs.contains(pv)))
                    .map(|(n, _)| n.clone())
                    .collect();
                drop(memory);
                for n in blocked {
                    c.queue.add(n);
                }
            }
        });
        pvc_informer.on_change_of(&this, |c, old, new| {
            let Some(pvc) = new.or(old) else { return };
            c.wake(&Waiting::Claim(key_of(&**pvc)));
        });
        pv_informer.on_change_of(&this, |c, old, new| {
            let Some(pv) = new.or(old) else { return };
            c.wake(&Waiting::Volume(
                pv.metadata.name.clone().unwrap_or_default(),
            ));
        });
        // A driver's attachRequired changes which volumes attach: every node looks again.
        driver_informer.on_change_of(&this, |c, _, _| {
            for n in c.nodes.all() {
                c.queue.add(n.metadata.name.clone().unwrap_or_default());
            }
        });
        this
    }

    /// Queues the nodes whose Pods wait for `what`.
    fn wake(&self, what: &Waiting) {
        let nodes: Vec<String> = self
            .memory
            .lock()
            .expect("attachdetach memory")
            .waiting
            .iter()
            .filter(|(_, w)| w.contains(what))
            .map(|(n, _)| n.clone())
            .collect();
        for n in nodes {
            self.queue.add(n);
        }
    }

    /// Waits for the caches, then runs the worker.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[
                &*self.nodes,
                &*self.pods,
                &*self.claims,
                &*self.volumes,
                &*self.drivers,
                &*self.attachments,
            ],
            &self.queue,
            1,
        )
        .await;
    }

    fn tell(&self, events: Vec<plan::PodEvent>) {
        for e in events {
            let first = self
                .memory
                .lock()
                .expect("attachdetach memory")
                .told
                .insert(e.once_key.clone());
            if !first {
                continue;
            }
            for p in &e.pods {
                let regarding = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(p.namespace.clone()),
                    name: Some(p.name.clone()),
                    uid: Some(p.uid.clone()),
                    ..Default::default()
                };
                self.recorder
                    .publish(&regarding, e.warning, e.reason, e.message.clone());
            }
        }
    }
}

impl SyncKey for Controller {
    async fn sync(&self, node: &str) -> Result<()> {
        let object = self.nodes.get("", node);
        let mut state = node_state(object.as_deref());
        state.assumed_mounted = self
            .memory
            .lock()
            .expect("attachdetach memory")
            .assumed_mounted
            .get(node)
            .cloned()
            .unwrap_or_default();
        let pods = self.pods.index(POD_NODE, node);
        let previous = self
            .memory
            .lock()
            .expect("attachdetach memory")
            .resolved
            .remove(node)
            .unwrap_or_default();
        let desired = plan::desired(&pods, &CacheLookup(self), &previous);
        let owned = {
            let mut memory = self.memory.lock().expect("attachdetach memory");
            if !memory.seeded {
                // The attachments there at the start, of volumes that exist (upstream's
                // `populateActualStateOfWorld`).
                memory.seeded = true;
                for a in self.attachments.all() {
                    let pv = a.spec.source.persistent_volume_name.as_deref();
                    if pv.is_some_and(|pv| self.volumes.get("", pv).is_some()) {
                        memory
                            .owned
                            .insert(a.metadata.name.clone().unwrap_or_default());
                    }
                }
            }
            for w in desired.volumes.values() {
                memory.owned.insert(w.attachment(node));
            }
            memory.owned.clone()
        };
        let is_owned =
            |a: &VolumeAttachment| a.metadata.name.as_ref().is_some_and(|n| owned.contains(n));
        let attachments: Vec<_> = self
            .attachments
            .index(VA_NODE, node)
            .into_iter()
            .filter(|a| is_owned(a))
            .collect();
        let elsewhere = |pv: &str| {
            let others: Vec<String> = self
                .attachments
                .index(VA_PV, pv)
                .iter()
                .filter(|a| a.spec.node_name != node && is_owned(a))
                .map(|a| a.spec.node_name.clone())
                .collect();
            if others.is_empty() {
                return None;
            }
            let memory = self.memory.lock().expect("attachdetach memory");
            Some(
                others
                    .iter()
                    .filter_map(|n| memory.desired.get(n)?.get(pv))
                    .flat_map(|w| w.pods.iter().cloned())
                    .collect(),
            )
        };
        let now = Instant::now();
        let since: HashMap<String, Instant> = {
            let mut memory = self.memory.lock().expect("attachdetach memory");
            let wanted: BTreeSet<String> = desired
                .volumes
                .values()
                .map(|w| w.attachment(node))
                .collect();
            let mut since = HashMap::new();
            for a in &attachments {
                let name = a.metadata.name.clone().unwrap_or_default();
                if wanted.contains(&name) {
                    memory.undesired_since.remove(&name);
                } else {
                    since.insert(
                        name.clone(),
                        *memory.undesired_since.entry(name).or_insert(now),
                    );
                }
            }
            since
        };
        let undesired_for = |name: &str| {
            since
                .get(name)
                .map_or(Duration::ZERO, |t| now.duration_since(*t))
        };
        let plan = plan::plan(
            node,
            &state,
            &desired.volumes,
            &attachments,
            &elsewhere,
            &undesired_for,
        );
        {
            let mut memory = self.memory.lock().expect("attachdetach memory");
            if state.exists {
                memory.resolved.insert(node.to_string(), desired.resolved);
                memory.desired.insert(node.to_string(), desired.volumes);
                memory.waiting.insert(node.to_string(), desired.waiting);
                memory
                    .blocked
                    .insert(node.to_string(), plan.blocked.clone());
            } else {
                memory.waiting.remove(node);
                memory.blocked.remove(node);
                memory.desired.remove(node);
            }
        }
        // The node stops reporting a volume before it is detached, and reports one only once
        // attached (upstream's node status updater runs before the reconciler's detaches).
        if let Some(report) = &plan.report {
            let api: Api<Node> = Api::all(self.client.clone());
            let patch = json!({"status": {"volumesAttached": report}});
            match api
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if apierrors::is_not_found(&e) => {}
                Err(e) => {
                    return Err(Error::kube(
                        "updating volumesAttached of",
                        format!("Node {node}"),
                        e,
                    ))
                }
            }
        }
        self.tell(plan.events);
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut last = Ok(());
        for (name, driver, pv) in plan.create {
            let va: VolumeAttachment = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {
                    "attacher": driver,
                    "nodeName": node,
                    "source": {"persistentVolumeName": pv},
                },
            }))
            .expect("a VolumeAttachment");
            let created = api.create(&PostParams::default(), &va).await;
            if created.is_ok() || created.as_ref().is_err_and(apierrors::is_already_exists) {
                self.memory
                    .lock()
                    .expect("attachdetach memory")
                    .assumed_mounted
                    .entry(node.to_string())
                    .or_default()
                    .insert(name.clone());
            }
            match created {
                Ok(_) => tracing::info!(
                    controller = NAME,
                    node,
                    volume = pv,
                    attachment = name,
                    "attaching"
                ),
                Err(e) if apierrors::is_already_exists(&e) => {}
                Err(e) => {
                    last = Err(Error::kube(
                        "creating",
                        format!("VolumeAttachment {name} (volume {pv}, node {node})"),
                        e,
                    ))
                }
            }
        }
        for d in plan.detach {
            match d {
                Detach::Wait { attachment, after } => {
                    tracing::info!(
                        controller = NAME,
                        node,
                        attachment,
                        "volume still in use on the node: detach waits"
                    );
                    self.queue.add_after(node.to_string(), after);
                }
                Detach::Now { attachment, forced } => {
                    if forced {
                        forced_detaches().inc();
                        tracing::warn!(
                            controller = NAME,
                            node,
                            attachment,
                            "forced detach: the node still reports the volume in use after {:?}",
                            plan::MAX_WAIT_FOR_UNMOUNT
                        );
                    }
                    let uid = attachments
                        .iter()
                        .find(|a| a.metadata.name.as_deref() == Some(attachment.as_str()))
                        .and_then(|a| a.metadata.uid.clone());
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid,
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&attachment, &params).await {
                        Ok(_) => tracing::info!(controller = NAME, node, attachment, "detaching"),
                        Err(e) if apierrors::is_not_found(&e) => {}
                        Err(e) => {
                            last = Err(Error::kube(
                                "deleting",
                                format!("VolumeAttachment {attachment} (node {node})"),
                                e,
                            ))
                        }
                    }
                }
            }
        }
        last
    }
}
