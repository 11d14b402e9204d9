//! VolumeBinding, as kube-scheduler v1.34's volumebinding plugin: a Pod's
//! PersistentVolumeClaims (and generic ephemeral volumes' claims) decide where it may go and are
//! bound before the Pod is.
//!
//! - PreFilter: every claim must exist (a generic ephemeral volume's must exist and be the
//!   Pod's), not be lost or being deleted; an unbound claim of an immediate class fails the Pod
//!   ("pod has unbound immediate PersistentVolumeClaims") until the PV controller binds it.
//!   PreFilter does not narrow the nodes to those a bound local volume names: kube-scheduler
//!   v1.34 filters every node (its FitError counts them "didn't match PersistentVolume's node
//!   affinity"), and so does this one.
//! - Filter: bound volumes' node affinity; for WaitForFirstConsumer claims, a matching
//!   Available volume on the node, or a class that can provision there ([`binder`]).
//! - Reserve / Unreserve: the chosen volumes' claimRef and the provisioned claims'
//!   selected-node annotation are assumed in the [`assume_cache`] (and dropped again), so the next
//!   Pod does not take the same volume.
//! - PreBind: the API writes (the volume's claimRef, as upstream's bindAPIUpdate, or the claim's
//!   `volume.kubernetes.io/selected-node`), then a wait until the PersistentVolume controller has
//!   bound every claim, within `bindTimeoutSeconds`.
//! - PreScore / Score: only with StorageCapacityScoring (alpha, off in v1.34): PreScore skips, as
//!   upstream's does without the feature.
//!
//! Owns the plugin's state and its API writes (PersistentVolume and PersistentVolumeClaim
//! updates) in PreBind; the decisions are [`binder`]'s.

pub mod assume_cache;
pub mod binder;
#[cfg(test)]
mod binder_tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::PostParams;
use kube::{Api, Client};

use self::assume_cache::AssumeCache;
use self::binder::{
    claim_fully_bound, find_pod_volumes, pod_volume_claims, PodVolumeClaims, PodVolumes,
};
use super::volume_util::{self as vu, claim_volume_name, volume_fits_node_labels};
use crate::scheduler::framework::{
    BoxFuture, ClusterObjects, CycleState, FilterPlugin, NodeInfo, Plugin, PreBindPlugin,
    PreFilterPlugin, PreFilterResult, PreScorePlugin, ReservePlugin, ScorePlugin, Snapshot, Status,
};
use crate::scheduler::plugin_args::VolumeBindingArgs;

pub const NAME: &str = "VolumeBinding";
const STATE_KEY: &str = "PreFilterVolumeBinding";
/// How often PreBind looks at the informers for the bindings to complete (upstream polls the
/// same caches every second).
const BIND_POLL: Duration = Duration::from_millis(100);

/// The cycle's data: the Pod's claims, what Filter found per node (written by the parallel
/// Filter calls, hence the lock), and whether Reserve found everything bound already.
#[derive(Clone, Default)]
struct StateData {
    claims: Arc<PodVolumeClaims>,
    by_node: Arc<Mutex<HashMap<String, NodeVolumes>>>,
    all_bound: bool,
}

/// Filter's finding on one node, with the node's labels (PreBind checks a provisioned volume's
/// node affinity against them, as upstream's checkBindings against the node).
#[derive(Clone, Default)]
struct NodeVolumes {
    volumes: PodVolumes,
    labels: Option<BTreeMap<String, String>>,
}

pub struct VolumeBinding {
    cache: Arc<AssumeCache>,
    client: Option<Client>,
    bind_timeout: Duration,
}

impl VolumeBinding {
    pub fn new(
        args: &VolumeBindingArgs,
        objects: Arc<dyn ClusterObjects>,
        client: Option<Client>,
    ) -> VolumeBinding {
        VolumeBinding {
            cache: Arc::new(AssumeCache::new(objects)),
            client,
            bind_timeout: Duration::from_secs(args.bind_timeout_seconds.max(0) as u64),
        }
    }

    /// The assume cache (tests look at what Reserve assumed).
    pub fn assume_cache(&self) -> &AssumeCache {
        &self.cache
    }

    /// `podHasPVCs`: whether the Pod has claims, each of which exists (informer copy), is not
    /// lost nor being deleted, and, for a generic ephemeral volume, is the Pod's.
    fn pod_has_pvcs(&self, pod: &Pod) -> Result<bool, String> {
        let ns = vu::ns(&pod.metadata);
        let claims = vu::pod_claims(pod);
        for c in &claims {
            let Some(pvc) = self.cache.get_api_pvc(ns, &c.name) else {
                return Err(if c.ephemeral {
                    format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim {:?}",
                        c.name
                    )
                } else {
                    format!("persistentvolumeclaim {:?} not found", c.name)
                });
            };
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
                return Err(format!(
                    "persistentvolumeclaim {:?} bound to non-existent persistentvolume {:?}",
                    c.name,
                    claim_volume_name(&pvc)
                ));
            }
            if pvc.metadata.deletion_timestamp.is_some() {
                return Err(format!(
                    "persistentvolumeclaim {:?} is being deleted",
                    c.name
                ));
            }
            if c.ephemeral {
                vu::volume_is_for_pod(pod, &pvc)?;
            }
        }
        Ok(!claims.is_empty())
    }

    /// `arePodVolumesBound`: every claim of the Pod fully bound (assumed copies included).
    fn pod_volumes_bound(&self, pod: &Pod) -> bool {
        let ns = vu::ns(&pod.metadata);
        vu::pod_claims(pod).iter().all(|c| {
            self.cache
                .get_pvc(ns, &c.name)
                .is_some_and(|p| claim_fully_bound(&p))
        })
    }

    /// Drops the assumptions of `volumes` (upstream's revertAssumedPVs / PVCs).
    fn revert(&self, volumes: &PodVolumes) {
        for b in &volumes.static_bindings {
            self.cache.restore_pv(vu::name(&b.pv.metadata));
        }
        for c in &volumes.dynamic_provisions {
            self.cache
                .restore_pvc(vu::ns(&c.metadata), vu::name(&c.metadata));
        }
    }

    /// `AssumePodVolumes`: the Pod's volumes as they will be once bound on `node`.
    fn assume(&self, node: &str, volumes: &PodVolumes) -> Result<PodVolumes, String> {
        let mut done = PodVolumes::default();
        for b in &volumes.static_bindings {
            let pv = binder::bind_volume_to_claim(&b.pv, &b.pvc);
            if pv != *b.pv {
                if let Err(e) = self.cache.assume_pv(pv.clone()) {
                    self.revert(&done);
                    return Err(e);
                }
            }
            done.static_bindings.push(binder::Binding {
                pv: Arc::new(pv),
                pvc: b.pvc.clone(),
            });
        }
        for c in &volumes.dynamic_provisions {
            let mut claim = (**c).clone();
            claim
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(vu::ANN_SELECTED_NODE.to_string(), node.to_string());
            if let Err(e) = self.cache.assume_pvc(claim.clone()) {
                self.revert(&done);
                return Err(e);
            }
            done.dynamic_provisions.push(Arc::new(claim));
        }
        Ok(done)
    }

    /// `bindAPIUpdate` then `checkBindings` until done: the volumes' claimRefs and the claims'
    /// selected node written, then every claim bound by the PV controller.
    async fn bind_pod_volumes(
        &self,
        node: &str,
        labels: Option<&BTreeMap<String, String>>,
        volumes: &PodVolumes,
    ) -> Result<(), String> {
        let client = self
            .client
            .clone()
            .ok_or("VolumeBinding has no API client to bind volumes with")?;
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let mut written_pvs = Vec::new();
        for b in &volumes.static_bindings {
            let name = vu::name(&b.pv.metadata);
            let new = pvs
                .replace(name, &PostParams::default(), &b.pv)
                .await
                .map_err(|e| format!("binding PersistentVolume {name:?}: {e}"))?;
            written_pvs.push((new, b.pvc.clone()));
        }
        let mut written_pvcs = Vec::new();
        for c in &volumes.dynamic_provisions {
            let (ns, name) = (vu::ns(&c.metadata), vu::name(&c.metadata));
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            let new = api
                .replace(name, &PostParams::default(), c)
                .await
                .map_err(|e| {
                    format!("selecting node for PersistentVolumeClaim \"{ns}/{name}\": {e}")
                })?;
            written_pvcs.push(new);
        }
        let deadline = Instant::now() + self.bind_timeout;
        loop {
            if self.check_bindings(node, labels, &written_pvs, &written_pvcs)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "binding volumes: timed out waiting for the condition after {:?}",
                    self.bind_timeout
                ));
            }
            tokio::time::sleep(BIND_POLL).await;
        }
    }

    /// `checkBindings`: Ok(true) when every claim is fully bound as intended; an error when a
    /// binding was undone (claimRef reset, provisioning given up: selected-node removed).
    fn check_bindings(
        &self,
        node: &str,
        labels: Option<&BTreeMap<String, String>>,
        bindings: &[(PersistentVolume, Arc<PersistentVolumeClaim>)],
        provisions: &[PersistentVolumeClaim],
    ) -> Result<bool, String> {
        let newer = |ours: &Option<String>, api: &Option<String>| {
            let v = |s: &Option<String>| s.as_deref().and_then(|x| x.parse::<u64>().ok());
            v(ours) > v(api)
        };
        for (pv, pvc) in bindings {
            let name = vu::name(&pv.metadata);
            let Some(api_pv) = self.cache.get_api_pv(name) else {
                return Err(format!(
                    "failed to check binding: could not find v1.PersistentVolume {name:?}"
                ));
            };
            let (ns, cname) = (vu::ns(&pvc.metadata), vu::name(&pvc.metadata));
            let Some(api_pvc) = self.cache.get_api_pvc(ns, cname) else {
                return Err(format!(
                    "failed to check binding: could not find v1.PersistentVolumeClaim \"{ns}/{cname}\""
                ));
            };
            if newer(
                &pv.metadata.resource_version,
                &api_pv.metadata.resource_version,
            ) {
                return Ok(false);
            }
            let uid = api_pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                .unwrap_or_default();
            if uid.is_empty() {
                return Err(format!("ClaimRef got reset for pv {name:?}"));
            }
            if !claim_fully_bound(&api_pvc) {
                return Ok(false);
            }
        }
        for c in provisions {
            let (ns, cname) = (vu::ns(&c.metadata), vu::name(&c.metadata));
            let Some(api) = self.cache.get_api_pvc(ns, cname) else {
                return Err(format!(
                    "failed to check provisioning pvc: could not find v1.PersistentVolumeClaim \"{ns}/{cname}\""
                ));
            };
            if newer(&c.metadata.resource_version, &api.metadata.resource_version) {
                return Ok(false);
            }
            if vu::selected_node(&api) != Some(node) {
                return Err(format!("provisioning failed for PVC {cname:?}"));
            }
            let vol = claim_volume_name(&api);
            if !vol.is_empty() {
                let Some(pv) = self.cache.get_api_pv(vol) else {
                    return Ok(false);
                };
                if !volume_fits_node_labels(&pv, labels) {
                    return Err(format!(
                        "pv {vol:?} node affinity doesn't match node {node:?}: no matching NodeSelectorTerms"
                    ));
                }
            }
            if !claim_fully_bound(&api) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        NAME
    }
}

fn state(cs: &CycleState) -> Result<&StateData, Status> {
    cs.read::<StateData>(STATE_KEY).ok_or_else(|| {
        Status::error(format!(
            "error reading {STATE_KEY:?} from cycleState: not found"
        ))
    })
}

impl PreFilterPlugin for VolumeBinding {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        match self.pod_has_pvcs(pod) {
            Err(e) => return (None, Status::unresolvable(e)),
            Ok(false) => {
                state.write(STATE_KEY, StateData::default());
                return (None, Status::skip());
            }
            Ok(true) => {}
        }
        let claims = match pod_volume_claims(pod, &self.cache) {
            Ok(c) => c,
            Err(e) => return (None, Status::error(e)),
        };
        if !claims.unbound_immediate.is_empty() {
            return (
                None,
                Status::unresolvable("pod has unbound immediate PersistentVolumeClaims"),
            );
        }
        state.write(
            STATE_KEY,
            StateData {
                claims: Arc::new(claims),
                ..StateData::default()
            },
        );
        (None, Status::success())
    }
}

impl FilterPlugin for VolumeBinding {
    fn filter(&self, cs: &CycleState, _pod: &Pod, node: &NodeInfo) -> Status {
        let st = match state(cs) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let Some(n) = node.node.as_ref() else {
            return Status::error("node not found");
        };
        match find_pod_volumes(&st.claims, n, &self.cache) {
            Err(e) => Status::error(e),
            Ok((_, reasons)) if !reasons.is_empty() => Status {
                code: crate::scheduler::framework::Code::UnschedulableAndUnresolvable,
                reasons: reasons.into_iter().map(String::from).collect(),
                plugin: "",
            },
            Ok((volumes, _)) => {
                st.by_node.lock().expect("state lock").insert(
                    node.name().to_string(),
                    NodeVolumes {
                        volumes,
                        labels: n.metadata.labels.clone(),
                    },
                );
                Status::success()
            }
        }
    }
}

/// Without StorageCapacityScoring (alpha, off by default in v1.34) upstream's PreScore skips,
/// so Score never runs; the same here.
impl PreScorePlugin for VolumeBinding {
    fn pre_score(
        &self,
        _state: &mut CycleState,
        _pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        Status::skip()
    }
}

impl ScorePlugin for VolumeBinding {
    fn score(&self, _state: &CycleState, _pod: &Pod, _node: &NodeInfo) -> Result<i64, Status> {
        Ok(0)
    }
}

impl ReservePlugin for VolumeBinding {
    fn reserve(&self, cs: &mut CycleState, pod: &Pod, node: &str) -> Status {
        let Some(st) = cs.read_mut::<StateData>(STATE_KEY) else {
            return Status::error(format!(
                "error reading {STATE_KEY:?} from cycleState: not found"
            ));
        };
        let mut by_node = st.by_node.lock().expect("state lock");
        let Some(found) = by_node.get_mut(node) else {
            // A Pod without claims.
            drop(by_node);
            st.all_bound = true;
            return Status::success();
        };
        if self.pod_volumes_bound(pod) {
            drop(by_node);
            st.all_bound = true;
            return Status::success();
        }
        match self.assume(node, &found.volumes) {
            Ok(assumed) => {
                found.volumes = assumed;
                drop(by_node);
                st.all_bound = false;
                Status::success()
            }
            Err(e) => Status::error(e),
        }
    }

    fn unreserve(&self, cs: &mut CycleState, _pod: &Pod, node: &str) {
        let Some(st) = cs.read::<StateData>(STATE_KEY) else {
            return;
        };
        if let Some(found) = st.by_node.lock().expect("state lock").get(node) {
            self.revert(&found.volumes);
        }
    }
}

impl PreBindPlugin for VolumeBinding {
    fn pre_bind<'a>(
        &'a self,
        cs: &'a CycleState,
        _pod: &'a Pod,
        node: &'a str,
    ) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let st = match state(cs) {
                Ok(s) => s,
                Err(s) => return s,
            };
            if st.all_bound {
                return Status::success();
            }
            let found = st.by_node.lock().expect("state lock").get(node).cloned();
            let Some(found) = found else {
                return Status::error(format!("no pod volumes found for node {node:?}"));
            };
            match self
                .bind_pod_volumes(node, found.labels.as_ref(), &found.volumes)
                .await
            {
                Ok(()) => Status::success(),
                Err(e) => {
                    self.revert(&found.volumes);
                    Status::error(e)
                }
            }
        })
    }
}
