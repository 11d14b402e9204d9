//! What the controller-manager keeps of a Pod: [`CachedPod`], the type its Pod informers watch and
//! cache and its controllers read.
//!
//! Pods are most of what a controller-manager caches (one per replica of every workload), and
//! k8s-openapi's `Pod` lays every field of the API out inline: about 2.2 KiB for the Pod, 2.1 KiB
//! per Container and 0.75 KiB per ContainerStatus before a single string, whatever the Pod sets.
//! No controller here reads a container's image, command, env, probes or mounts, so
//! the cache keeps the fields below, with the same names and nesting as `Pod` (a reader writes
//! `pod.spec.as_ref().and_then(|s| s.node_name.as_deref())` either way). Deserializing a watched
//! Pod straight into this type skips the other fields without building them. What that saves at
//! the benchmark's sizes is in docs/BENCHMARKS.md ("Workload controllers").
//!
//! Kept, and who reads it: metadata (everyone); nodeName, hostname, subdomain (ranking, the
//! DaemonSet's and StatefulSet's identity, endpoints); the required node affinity (a DaemonSet
//! Pod's target node); tolerations (the taint eviction controller; nearly every Pod carries the
//! two NoExecute ones the API server's DefaultTolerationSeconds admission adds); restartPolicy (Jobs); per container its name, ports (named target ports)
//! and restartPolicy (sidecars), its requests and the Pod-level ones (the horizontal Pod
//! autoscaler's utilization); resourceClaims and status.resourceClaimStatuses (the resourceclaim
//! controller); volumes' names, claims and ephemeral claim templates (StatefulSet storage, the volume
//! controllers); status phase,
//! reason, conditions (type, status, reason, lastTransitionTime), Pod IPs, startTime and per container its name, readiness, restart count
//! and state (ranking, availability, Job failure policies). For quota usage (the resourcequota
//! controller): each container's and the Pod-level requests and limits, overhead,
//! priorityClassName, activeDeadlineSeconds, status.qosClass and each container status's
//! resources (what an in-place resize actuated).
//!
//! Owns the type and its mapping to the API's `Pod`; no controller logic. Pods the controllers
//! create or patch are written with the API's types, never from a `CachedPod`, so nothing a cache
//! leaves out is ever written back.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ContainerPort, ContainerState, EphemeralVolumeSource,
    PersistentVolumeClaimVolumeSource, Pod, PodIP, PodResourceClaim, PodResourceClaimStatus,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

/// The part of a Pod the controllers read (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedPodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedPodStatus>,
}

/// The Pod cache's index of Pods by the node they are bound to, one for every controller that
/// looks up a node's Pods (each registers it: registering it again rebuilds the same index).
pub const NODE_INDEX: &str = "pod-node";

/// [`NODE_INDEX`] of a Pod: its node, when it is bound.
pub fn node_index(p: &CachedPod) -> Vec<String> {
    p.node_name().map(str::to_string).into_iter().collect()
}

impl CachedPod {
    /// `status.phase` ("" when the API server has not set one yet).
    pub fn phase(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or_default()
    }

    /// Succeeded or Failed: the Pod has terminated and never runs again.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase(), "Succeeded" | "Failed")
    }

    /// The node the Pod is bound to (`spec.nodeName`, when set and not empty): the key of
    /// [`NODE_INDEX`].
    pub fn node_name(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
    }

    /// Each of the Pod's volumes that uses a claim in its namespace, with that claim's name: a
    /// claim volume's `claimName`, a generic ephemeral volume's `<pod>-<volume>`
    /// (`ephemeral.VolumeClaimName`).
    pub fn volume_claims(&self) -> impl Iterator<Item = (&str, String)> {
        let pod = self.metadata.name.as_deref().unwrap_or_default();
        self.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(move |v| match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => Some((v.name.as_str(), c.claim_name.clone())),
                (None, Some(_)) => Some((v.name.as_str(), format!("{pod}-{}", v.name))),
                (None, None) => None,
            })
    }

    /// The names of the claims the Pod's volumes use ([`CachedPod::volume_claims`]).
    pub fn claim_names(&self) -> Vec<String> {
        self.volume_claims().map(|(_, claim)| claim).collect()
    }
}

/// The Pod cache's index of Pods by the claims they use, as `namespace/claim`
/// ([`CachedPod::claim_names`]): one index for every controller that looks Pods up by claim
/// (the volume binder, pvc-protection, ephemeral-volume), registered by each with
/// [`claim_keys`] (registering it again replaces it with itself), computed once per Pod change.
pub const POD_CLAIMS: &str = "pod-claims";

/// The keys of [`POD_CLAIMS`] for `p`.
pub fn claim_keys(p: &CachedPod) -> Vec<String> {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    p.claim_names()
        .into_iter()
        .map(|c| format!("{ns}/{c}"))
        .collect()
}

/// The kept part of a `PodSpec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    /// Boxed: set on few Pods, and large inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<Affinity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default)]
    pub containers: Vec<CachedContainer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<CachedContainer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<CachedVolume>>,
    /// The Pod's ResourceClaims (the resourceclaim controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claims: Option<Vec<PodResourceClaim>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<BTreeMap<String, Quantity>>,
    /// Pod-level requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<CachedResources>,
}

/// A container's (or the Pod's) resource requests and limits.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// The kept part of a `Container`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    /// Its requests (the horizontal Pod autoscaler's utilization, quota usage) and limits
    /// (quota usage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<CachedResources>,
}

/// The kept part of a `Volume`: its name and, for a claim, the claim; for a generic ephemeral
/// volume, its claim template (the ephemeral-volume controller creates the claim from it).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedVolume {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// Boxed: set on few Pods, and large inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<Box<EphemeralVolumeSource>>,
}

/// The kept part of a `PodStatus`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<CachedPodCondition>>,
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(rename = "podIPs", default, skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<PodIP>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<CachedContainerStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    /// The ResourceClaims generated for the Pod's claims (the resourceclaim controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claim_statuses: Option<Vec<PodResourceClaimStatus>>,
}

/// The kept part of a `PodCondition` (its message and probe time are read by no controller).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// The kept part of a `ContainerStatus`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
    /// The resources the runtime actuated (in-place resize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<CachedResources>,
}

impl crate::helpers::containers::RestartPolicy for CachedContainer {
    fn restart_policy(&self) -> Option<&str> {
        self.restart_policy.as_deref()
    }
}

impl k8s_openapi::Resource for CachedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<&Pod> for CachedPod {
    /// What a cache would keep of `pod` (through its JSON, as a watch delivers it).
    fn from(pod: &Pod) -> Self {
        let json = serde_json::to_value(pod).expect("a Pod serializes");
        serde_json::from_value(json).expect("a serialized Pod reads back as a CachedPod")
    }
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        Self::from(&pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_keeps_what_controllers_read_and_drops_the_rest() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"}},
            "spec": {
                "nodeName": "n1", "hostname": "h", "subdomain": "s", "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "nginx", "env": [{"name": "X", "value": "1"}],
                    "ports": [{"name": "http", "containerPort": 80}]}],
                "initContainers": [{"name": "side", "image": "x", "restartPolicy": "Always"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-p-0"}},
                    {"name": "cfg", "configMap": {"name": "cfg"}}
                ]
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2,
                    "image": "nginx", "imageID": "", "state": {"terminated": {"exitCode": 3}}}]
            }
        }))
        .unwrap();
        let cached = CachedPod::from(&pod);
        let spec = cached.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.hostname.as_deref(), Some("h"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.containers[0].ports.as_ref().unwrap()[0].container_port,
            80
        );
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.restart_policy.as_deref(), Some("Always"));
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-p-0"
        );
        assert!(volumes[1].persistent_volume_claim.is_none());
        let status = cached.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "10.0.0.1");
        let ready = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "True")
        );
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!((cs.ready, cs.restart_count), (true, 2));
        let exit = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(exit.exit_code, 3);
        // What no controller reads is not kept.
        let back = serde_json::to_value(&cached).unwrap();
        assert!(back["spec"]["containers"][0].get("image").is_none());
        assert!(back["spec"]["containers"][0].get("env").is_none());
        assert!(back["spec"]["volumes"][1].get("configMap").is_none());
    }

    #[test]
    fn a_cached_pod_is_much_smaller_than_the_api_pod() {
        // The inline layouts: what every cached Pod pays before its strings.
        assert!(std::mem::size_of::<CachedPod>() * 2 < std::mem::size_of::<Pod>());
        assert!(
            std::mem::size_of::<CachedContainer>() * 10
                < std::mem::size_of::<k8s_openapi::api::core::v1::Container>()
        );
    }
}
