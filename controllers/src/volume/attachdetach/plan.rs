//! What one node's volumes need, decided over cached state: the attach/detach controller's
//! desired state of the world (the Pods' attachable volumes), its actual state (the node's
//! VolumeAttachments) and its reconciler's decisions (create, wait, detach, report), as one pure
//! function of a node (upstream's `desiredStateOfWorldPopulator`, `reconciler.reconcile` and
//! `nodeStatusUpdater`, for the CSI plugin: every attachable volume of v1.34 is CSI's).
//!
//! Owns the decision only; the API calls, the Events and the timers are [`super`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{AttachedVolume, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::runtime::cached_pod::CachedPod;

/// The node annotation kubelet sets (`--enable-controller-attach-detach`, on by default) when the
/// controller, not kubelet, attaches and detaches its volumes.
pub const ANN_CONTROLLER_MANAGED: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// How long a detach waits for kubelet to report the volume unmounted (`volumesInUse`) before
/// it goes ahead anyway (upstream's `reconcilerMaxWaitForUnmountDuration`).
pub const MAX_WAIT_FOR_UNMOUNT: Duration = Duration::from_secs(6 * 60);

/// The CSI plugin's name, the prefix of its unique volume names.
pub const CSI_PLUGIN: &str = "kubernetes.io/csi";

/// The VolumeAttachment a CSI volume gets on a node: `csi-` and the hex SHA-256 of the volume
/// handle, the driver and the node (the CSI attacher's `getAttachmentName`), so the controller,
/// kubelet and the external-attacher all find it by name.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{handle}{driver}{node}").as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// The name kubelet looks for in the node's `status.volumesAttached` (and reports in
/// `volumesInUse`): `kubernetes.io/csi/<driver>^<handle>`.
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("{CSI_PLUGIN}/{driver}^{handle}")
}

/// A Pod that uses a volume: what an Event on it needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodUse {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// An attachable volume some Pod on the node uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The PersistentVolume.
    pub pv: String,
    pub driver: String,
    pub handle: String,
    /// Whether another node may have it attached at the same time (ReadWriteMany or
    /// ReadOnlyMany, or no access mode given: upstream's `isMultiAttachAllowed`).
    pub multi_attach: bool,
    pub pods: BTreeSet<PodUse>,
}

impl Wanted {
    pub fn attachment(&self, node: &str) -> String {
        attachment_name(&self.handle, &self.driver, node)
    }

    pub fn unique_name(&self) -> String {
        unique_volume_name(&self.driver, &self.handle)
    }
}

/// Why a Pod's volume is not (yet) known to be attachable: the object whose change is worth a
/// new look at the node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Waiting {
    /// `namespace/name` of a claim that is missing or not Bound.
    Claim(String),
    /// A PersistentVolume a Bound claim names and the cache does not have.
    Volume(String),
}

/// Whether a Pod's volumes still count: scheduled, not terminated (upstream's
/// `util.IsPodTerminated`: Succeeded or Failed, or being deleted with no container running).
pub fn pod_counts(pod: &CachedPod) -> bool {
    if pod.is_terminal() {
        return false;
    }
    if pod.metadata.deletion_timestamp.is_none() {
        return true;
    }
    let running = pod
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .any(|c| {
            c.state
                .as_ref()
                .is_some_and(|s| s.terminated.is_none() && s.waiting.is_none())
        });
    running
}

/// What [`desired`] reads of the cluster besides the node's Pods.
pub trait Lookup {
    fn claim(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<PersistentVolumeClaim>>;
    fn volume(&self, name: &str) -> Option<std::sync::Arc<PersistentVolume>>;
    /// Whether the CSI driver needs attaching: its CSIDriver's `attachRequired`, true when it
    /// has no CSIDriver object or leaves the field out.
    fn attach_required(&self, driver: &str) -> bool;
}

/// The node's desired state: every attachable volume its counting Pods use (by PersistentVolume
/// name), and what the others wait for. A Pod volume that cannot be resolved now keeps what it
/// resolved to before (`previous`, by `<pod uid>/<volume>`), as upstream's desired state keeps a
/// volume until its Pod goes: a claim briefly missing from the cache must not detach a volume in
/// use. `resolved` is what to pass as `previous` next time.
pub struct Desired {
    pub volumes: BTreeMap<String, Wanted>,
    pub waiting: BTreeSet<Waiting>,
    pub resolved: BTreeMap<String, Wanted>,
}

pub fn desired(
    pods: &[std::sync::Arc<CachedPod>],
    lookup: &dyn Lookup,
    previous: &BTreeMap<String, Wanted>,
) -> Desired {
    let mut out = Desired {
        volumes: BTreeMap::new(),
        waiting: BTreeSet::new(),
        resolved: BTreeMap::new(),
    };
    for pod in pods.iter().filter(|p| pod_counts(p)) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let user = PodUse {
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        };
        for (volume, claim) in pod.volume_claims() {
            let key = format!("{uid}/{volume}");
            let resolved = match resolve(ns, &claim, lookup) {
                Ok(Some(w)) => Some(w),
                Ok(None) => None,
                Err(w) => {
                    out.waiting.insert(w);
                    previous.get(&key).cloned()
                }
            };
            let Some(mut w) = resolved else { continue };
            w.pods.clear();
            out.resolved.insert(key, w.clone());
            out.volumes
                .entry(w.pv.clone())
                .or_insert(w)
                .pods
                .insert(user.clone());
        }
    }
    out
}

/// A claim to its attachable volume: `Ok(None)` when the volume is not one that attaches (not
/// CSI, or a driver without attach), `Err` when the claim or the volume is not there yet.
fn resolve(ns: &str, claim: &str, lookup: &dyn Lookup) -> Result<Option<Wanted>, Waiting> {
    let key = format!("{ns}/{claim}");
    let pvc = lookup
        .claim(ns, claim)
        .ok_or_else(|| Waiting::Claim(key.clone()))?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| bound && !n.is_empty())
        .ok_or(Waiting::Claim(key))?;
    let pv = lookup
        .volume(&pv_name)
        .ok_or_else(|| Waiting::Volume(pv_name.clone()))?;
    let Some(spec) = pv.spec.as_ref() else {
        return Ok(None);
    };
    // A volume whose claimRef is another claim (a bind in progress, or a stale cache) is not
    // this claim's yet (upstream's `getPVSpecFromCache`).
    let claim_uid = spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref());
    if claim_uid != pvc.metadata.uid.as_deref() {
        return Err(Waiting::Volume(pv_name));
    }
    let Some(csi) = spec.csi.as_ref() else {
        return Ok(None);
    };
    if !lookup.attach_required(&csi.driver) {
        return Ok(None);
    }
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    let multi_attach = modes.is_empty()
        || modes
            .iter()
            .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    Ok(Some(Wanted {
        pv: pv_name,
        driver: csi.driver.clone(),
        handle: csi.volume_handle.clone(),
        multi_attach,
        pods: BTreeSet::new(),
    }))
}

/// What the node reports and holds, read from its object.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    /// Whether the Node exists.
    pub exists: bool,
    /// Whether it carries [`ANN_CONTROLLER_MANAGED`] = "true".
    pub managed: bool,
    /// `status.volumesAttached` names.
    pub reported: BTreeSet<String>,
    /// `status.volumesInUse`.
    pub in_use: BTreeSet<String>,
    /// Attachments made since the node last changed: taken as mounted whatever `volumesInUse`
    /// says, since kubelet may have mounted them after the Node the cache holds (upstream's
    /// actual state starts a new attachment as `mountedByNode` until the next node update).
    pub assumed_mounted: BTreeSet<String>,
}

/// A detach the reconciler has decided on or holds back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detach {
    /// Delete the VolumeAttachment now; `forced` when kubelet still reports the volume in use
    /// and [`MAX_WAIT_FOR_UNMOUNT`] has passed.
    Now { attachment: String, forced: bool },
    /// Kubelet still has it mounted: look again after this long.
    Wait { attachment: String, after: Duration },
}

/// An Event on the Pods of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    pub pods: BTreeSet<PodUse>,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
    /// What the event is about, so the apply layer tells it once (`<attachment>/<what>`).
    pub once_key: String,
}

/// The reconciler's decisions for one node.
#[derive(Debug, Default)]
pub struct Plan {
    /// VolumeAttachments to create: (name, driver, PersistentVolume).
    pub create: Vec<(String, String, String)>,
    pub detach: Vec<Detach>,
    /// The node's new `status.volumesAttached`, when it differs from what it reports.
    pub report: Option<Vec<AttachedVolume>>,
    pub events: Vec<PodEvent>,
    /// PersistentVolumes held back because another node has them attached exclusively.
    pub blocked: BTreeSet<String>,
}

/// The decisions for node `node`. `attachments` are the VolumeAttachments on the node of a
/// PersistentVolume source; `elsewhere(pv)` is `Some` when another node has that volume's
/// attachment (attached, being attached or being detached), with the Pods there that use it;
/// `undesired_for(attachment)` how long a detach has been waiting.
pub fn plan(
    node: &str,
    state: &NodeState,
    wanted: &BTreeMap<String, Wanted>,
    attachments: &[std::sync::Arc<VolumeAttachment>],
    elsewhere: &dyn Fn(&str) -> Option<Vec<PodUse>>,
    undesired_for: &dyn Fn(&str) -> Duration,
) -> Plan {
    let mut out = Plan::default();
    if state.exists && !state.managed {
        // Kubelet attaches this node's volumes itself.
        return out;
    }
    let wanted: &BTreeMap<String, Wanted> = if state.exists {
        wanted
    } else {
        &BTreeMap::new()
    };
    let by_name: BTreeMap<&str, &VolumeAttachment> = attachments
        .iter()
        .map(|a| (a.metadata.name.as_deref().unwrap_or_default(), &**a))
        .collect();
    let mut report = Vec::new();
    for w in wanted.values() {
        let name = w.attachment(node);
        match by_name.get(name.as_str()) {
            None => {
                if let Some(others) = (!w.multi_attach).then(|| elsewhere(&w.pv)).flatten() {
                    out.blocked.insert(w.pv.clone());
                    for pod in &w.pods {
                        out.events.push(PodEvent {
                            message: multi_attach_message(&w.pv, pod, &others),
                            pods: [pod.clone()].into(),
                            warning: true,
                            reason: "FailedAttachVolume",
                            once_key: format!("{name}/multi-attach/{}", pod.uid),
                        });
                    }
                } else {
                    out.create.push((name, w.driver.clone(), w.pv.clone()));
                }
            }
            Some(a) => {
                if a.metadata.deletion_timestamp.is_some() {
                    // A detach still finishing: attach again once it is gone.
                    continue;
                }
                let status = a.status.as_ref();
                if status.is_some_and(|s| s.attached) {
                    let unique = w.unique_name();
                    if !state.reported.contains(&unique) {
                        out.events.push(PodEvent {
                            pods: w.pods.clone(),
                            warning: false,
                            reason: "SuccessfulAttachVolume",
                            message: format!(
                                "AttachVolume.Attach succeeded for volume {:?} ",
                                w.pv
                            ),
                            once_key: format!(
                                "{name}/attached/{}",
                                a.metadata.uid.as_deref().unwrap_or_default()
                            ),
                        });
                    }
                    report.push(AttachedVolume {
                        name: unique,
                        device_path: String::new(),
                    });
                } else if let Some(err) = status.and_then(|s| s.attach_error.as_ref()) {
                    let message = err.message.clone().unwrap_or_default();
                    out.events.push(PodEvent {
                        pods: w.pods.clone(),
                        warning: true,
                        reason: "FailedAttachVolume",
                        message: format!(
                            "AttachVolume.Attach failed for volume {:?} : {message}",
                            w.pv
                        ),
                        once_key: format!("{name}/error/{message}"),
                    });
                }
            }
        }
    }
    let wanted_names: BTreeSet<String> = wanted.values().map(|w| w.attachment(node)).collect();
    // Attachment name -> unique volume name, for the volumes the node names.
    let known: BTreeMap<String, String> = state
        .in_use
        .iter()
        .chain(&state.reported)
        .filter_map(|u| Some((attachment_of(node, u)?, u.clone())))
        .collect();
    let in_use = attachment_names(node, &state.in_use);
    for a in attachments {
        let name = a.metadata.name.clone().unwrap_or_default();
        if wanted_names.contains(&name) || a.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let mounted = in_use.contains(&name) || state.assumed_mounted.contains(&name);
        let waited = undesired_for(&name);
        out.detach.push(if !mounted {
            Detach::Now {
                attachment: name,
                forced: false,
            }
        } else if waited >= MAX_WAIT_FOR_UNMOUNT {
            Detach::Now {
                attachment: name,
                forced: true,
            }
        } else {
            // Still mounted: still reported attached (upstream takes a volume out of
            // `volumesAttached` only as it detaches it).
            let attached = a.status.as_ref().is_some_and(|s| s.attached);
            if let Some(unique) = known.get(&name).filter(|_| attached) {
                report.push(AttachedVolume {
                    name: unique.clone(),
                    device_path: String::new(),
                });
            }
            Detach::Wait {
                attachment: name,
                after: MAX_WAIT_FOR_UNMOUNT - waited,
            }
        });
    }
    report.sort_by(|a, b| a.name.cmp(&b.name));
    let names: BTreeSet<String> = report.iter().map(|v| v.name.clone()).collect();
    if state.exists && names != state.reported {
        out.report = Some(report);
    }
    out
}

/// The Multi-Attach Event's message for `pod` (upstream's `reportMultiAttachError`): the Pods
/// elsewhere that hold the volume, named only when they are in the Pod's own namespace.
fn multi_attach_message(pv: &str, pod: &PodUse, others: &[PodUse]) -> String {
    let mut local: Vec<&str> = others
        .iter()
        .filter(|o| o.namespace == pod.namespace)
        .map(|o| o.name.as_str())
        .collect();
    local.sort_unstable();
    let foreign = others.len() - local.len();
    let detail = if others.is_empty() {
        "Volume is already exclusively attached to one node and can't be attached to another"
            .to_string()
    } else if local.is_empty() {
        format!("Volume is already used by {foreign} pod(s) in different namespaces")
    } else if foreign > 0 {
        format!(
            "Volume is already used by pod(s) {} and {foreign} pod(s) in different namespaces",
            local.join(", ")
        )
    } else {
        format!("Volume is already used by pod(s) {}", local.join(", "))
    };
    format!("Multi-Attach error for volume {pv:?} {detail}")
}

/// The attachment names of the unique volume names a node lists (`volumesInUse`): a CSI name
/// `kubernetes.io/csi/<driver>^<handle>` carries what [`attachment_name`] hashes, so an
/// attachment is matched even when its PersistentVolume is gone.
pub fn attachment_names(node: &str, unique_names: &BTreeSet<String>) -> BTreeSet<String> {
    unique_names
        .iter()
        .filter_map(|u| attachment_of(node, u))
        .collect()
}

/// The attachment name on `node` of one CSI unique volume name (none for another plugin's).
fn attachment_of(node: &str, unique_name: &str) -> Option<String> {
    let (driver, handle) = unique_name
        .strip_prefix(CSI_PLUGIN)?
        .strip_prefix('/')?
        .split_once('^')?;
    Some(attachment_name(handle, driver, node))
}
