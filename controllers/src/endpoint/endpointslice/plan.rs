//! The EndpointSlice plan: from a Service, its Pods and the slices that exist, which slices to
//! create, update and delete. Pure functions only; the apply layer lives in `super`.
//!
//! Follows kube-controller-manager's reconciler: endpoints are grouped by address type and by their
//! resolved port set (named target ports can resolve differently per Pod); existing slices are kept
//! and edited in place (minimal churn), endpoints that moved or appeared fill slices that are being
//! updated anyway, then unchanged slices with room (fullest first), and only then new slices of at
//! most `MAX_ENDPOINTS_PER_SLICE`. Named target ports resolve on containers, then on sidecars
//! (restartable init containers), as upstream's `FindPort` (`endpointutil::resolve_target_port`). Each
//! Pod's Node is looked up (`NodeInfo`): a known Node gives the endpoint's zone; a Node known to be
//! missing leaves the Pod out unless the Service has publishNotReadyAddresses, as upstream; when
//! Nodes cannot be read nothing is known and the Pod is kept without a zone. With `trafficDistribution` PreferClose,
//! PreferSameZone or PreferSameNode (and no `service.kubernetes.io/topology-mode: Auto`), ready
//! endpoints carry hints for their own zone (and node), as upstream's `trafficdist` does; the
//! `topology-mode: Auto` hints (proportional to CPU per zone) are not written. Unlike upstream, which leaves an unchanged slice alone unless all
//! new endpoints fit in it, existing slices are always filled first: one more write now, fewer
//! half-empty slices later. A Service without endpoints keeps one empty placeholder slice.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

use crate::endpoint::endpointutil;
use crate::runtime::cached_pod::CachedPod;

/// At most this many endpoints go into one slice (kube-controller-manager's default).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The label linking a slice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The value of `LABEL_MANAGED_BY` this controller writes and owns, upstream's: it replaces
/// kube-controller-manager's endpointslice controller, so it takes over the slices that one made
/// (a cluster moving to kpr keeps one set of slices per Service, not a stale one beside a new
/// one), and the Conformance suite checks the value.
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// Another value for this process (`--endpointslice-managed-by`), set once before the
/// controller starts.
static MANAGED_BY_OVERRIDE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes this process's controller write and own slices labelled `value` instead of
/// [`MANAGED_BY`]: to run it beside kube-controller-manager's own, each with its slices (as the
/// differential test does). Once per process; a second, different value is an error.
pub fn set_managed_by(value: &str) -> Result<(), String> {
    let set = MANAGED_BY_OVERRIDE.get_or_init(|| value.to_string());
    if set != value {
        return Err(format!(
            "--endpointslice-managed-by {value:?}: this process already uses {set:?}"
        ));
    }
    Ok(())
}

/// The `LABEL_MANAGED_BY` value of this process's slices.
pub fn managed_by() -> &'static str {
    MANAGED_BY_OVERRIDE
        .get()
        .map(String::as_str)
        .unwrap_or(MANAGED_BY)
}

/// What the apply layer must do.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// New slices (with `generateName`).
    pub create: Vec<EndpointSlice>,
    /// Existing slices with new content (carrying their resourceVersion).
    pub update: Vec<EndpointSlice>,
    /// Existing slices to remove.
    pub delete: Vec<EndpointSlice>,
}

impl Plan {
    /// No API call needed.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// Ordered identity of a port set: (name, protocol, port, appProtocol) per port.
type PortKey = Vec<(Option<String>, Option<String>, Option<i32>, Option<String>)>;

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut k: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.protocol.clone(),
                p.port,
                p.app_protocol.clone(),
            )
        })
        .collect();
    k.sort();
    k
}

/// The endpoints of a slice (a required list in the v1.34 API; empty means none).
pub fn endpoints_of(s: &EndpointSlice) -> &[Endpoint] {
    &s.endpoints
}

fn endpoints_mut(s: &mut EndpointSlice) -> &mut Vec<Endpoint> {
    &mut s.endpoints
}

/// Whether a slice is one this controller manages.
pub fn is_managed(slice: &EndpointSlice) -> bool {
    slice.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(managed_by())
}

/// The labels every slice of this Service carries: the Service's own labels plus ours.
pub fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.labels().clone();
    labels.insert(LABEL_SERVICE_NAME.into(), svc.name_any());
    labels.insert(LABEL_MANAGED_BY.into(), managed_by().into());
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    labels
}

/// The controller ownerReference pointing at the Service.
pub fn owner_ref(svc: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: svc.name_any(),
        uid: svc.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn address_types(svc: &Service) -> Vec<String> {
    let fams = svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default();
    let mut out: Vec<String> = fams
        .into_iter()
        .filter(|f| f == "IPv4" || f == "IPv6")
        .collect();
    if out.is_empty() {
        out.push("IPv4".into());
    }
    out
}

fn family_ip(pod: &CachedPod, address_type: &str) -> Option<IpAddr> {
    endpointutil::pod_ips(pod)
        .into_iter()
        .find(|ip| ip.is_ipv4() == (address_type == "IPv4"))
}

/// The endpoint ports of one Pod: every Service port whose target resolves on it.
pub fn endpoint_ports(svc: &Service, pod: &CachedPod) -> Vec<EndpointPort> {
    endpointutil::resolved_ports(svc, pod)
        .map(|(sp, port, protocol)| EndpointPort {
            name: Some(sp.name.clone().unwrap_or_default()),
            port: Some(port),
            protocol: Some(protocol),
            app_protocol: sp.app_protocol.clone(),
        })
        .collect()
}

/// Whether the Service asks for topology-aware hints through the annotation (upstream's
/// `hintsEnabled`): then `trafficDistribution` is not used.
fn topology_mode_auto(svc: &Service) -> bool {
    let a = svc.annotations();
    let v = a
        .get("service.kubernetes.io/topology-aware-hints")
        .or_else(|| a.get("service.kubernetes.io/topology-mode"));
    matches!(v.map(String::as_str), Some("Auto" | "auto"))
}

/// The hints of one endpoint under the Service's `trafficDistribution` (upstream's
/// `preferCloseHeuristic`): ready endpoints get their own zone (and, for PreferSameNode, their own
/// node); everything else gets none.
fn hints(svc: &Service, ep: &Endpoint) -> Option<EndpointHints> {
    let td = svc
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref());
    let close = matches!(
        td,
        Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
    );
    let ready = ep.conditions.as_ref().and_then(|c| c.ready) == Some(true);
    if !close || !ready || topology_mode_auto(svc) {
        return None;
    }
    let for_zones = ep.zone.as_ref().map(|z| vec![ForZone { name: z.clone() }]);
    let for_nodes = ep
        .node_name
        .as_ref()
        .filter(|_| td == Some("PreferSameNode"))
        .map(|n| vec![ForNode { name: n.clone() }]);
    (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
        for_zones,
        for_nodes,
    })
}

/// What the controller knows about the Node a Pod names in `spec.nodeName`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeInfo {
    /// The Node exists; its `topology.kubernetes.io/zone` label, if any.
    Known {
        /// The endpoint's zone.
        zone: Option<String>,
    },
    /// The Node cache is complete and has no such Node: the Pod is left out (unless the Service
    /// has publishNotReadyAddresses), as upstream's reconciler does.
    Missing,
    /// Nodes cannot be read (forbidden, or not listed yet): nothing is known, the Pod is kept
    /// without a zone.
    Unreadable,
}

/// Looks up a Node by name (`""` for a Pod without `spec.nodeName`).
pub type NodeOf<'a> = &'a dyn Fn(&str) -> NodeInfo;

/// The label a Node's zone is read from.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// The endpoint of one Pod; `zone` is its Node's.
pub fn pod_endpoint(svc: &Service, pod: &CachedPod, ip: IpAddr, zone: Option<String>) -> Endpoint {
    let c = endpointutil::conditions(pod, endpointutil::publish_not_ready(svc));
    let spec = pod.spec.as_ref();
    let hostname = spec
        .filter(|s| s.subdomain.as_deref() == Some(svc.name_any().as_str()))
        .and_then(|s| s.hostname.clone());
    let mut ep = Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(c.ready),
            serving: Some(c.serving),
            terminating: Some(c.terminating),
        }),
        hostname,
        node_name: spec.and_then(|s| s.node_name.clone()),
        zone,
        target_ref: Some(endpointutil::pod_reference(pod)),
        ..Default::default()
    };
    ep.hints = hints(svc, &ep);
    ep
}

/// Desired endpoints of one address type, grouped by port set, keyed by address.
type Desired = BTreeMap<PortKey, (Vec<EndpointPort>, BTreeMap<String, Endpoint>)>;

fn desired(
    svc: &Service,
    pods: &[Arc<CachedPod>],
    address_type: &str,
    node_of: NodeOf<'_>,
) -> Desired {
    let mut out = Desired::new();
    for pod in pods
        .iter()
        .filter(|p| endpointutil::should_be_in_endpoints(p, true))
    {
        let Some(ip) = family_ip(pod, address_type) else {
            continue;
        };
        let ports = endpoint_ports(svc, pod);
        let entry = out
            .entry(port_key(&ports))
            .or_insert_with(|| (ports, BTreeMap::new()));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let zone = match node_of(node.unwrap_or_default()) {
            NodeInfo::Known { zone } => zone,
            // Upstream skips (and retries later) unless the addresses are published anyway.
            NodeInfo::Missing if !endpointutil::publish_not_ready(svc) => continue,
            NodeInfo::Missing | NodeInfo::Unreadable => None,
        };
        entry
            .1
            .insert(ip.to_string(), pod_endpoint(svc, pod, ip, zone));
    }
    out
}

fn new_slice(
    svc: &Service,
    address_type: &str,
    ports: Vec<EndpointPort>,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", svc.name_any())),
            namespace: svc.namespace(),
            labels: Some(slice_labels(svc)),
            owner_references: Some(vec![owner_ref(svc)]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints,
        ports: Some(ports),
    }
}

/// Upstream's `ownedBy`: the slice's controller reference is this Service object.
fn owned_by(svc: &Service, slice: &EndpointSlice) -> bool {
    slice
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == svc.uid().as_ref())
}

fn metadata_current(svc: &Service, slice: &EndpointSlice) -> bool {
    owned_by(svc, slice) && slice.labels() == &slice_labels(svc)
}

fn with_metadata(svc: &Service, mut slice: EndpointSlice) -> EndpointSlice {
    slice.metadata.labels = Some(slice_labels(svc));
    let mut owners: Vec<OwnerReference> = slice
        .owner_references()
        .iter()
        .filter(|o| o.controller != Some(true))
        .cloned()
        .collect();
    owners.push(owner_ref(svc));
    slice.metadata.owner_references = Some(owners);
    slice
}

/// Plans the slices of one Service when Nodes cannot be read (see `plan_with_nodes`): every
/// Pod is kept, no endpoint has a zone.
pub fn plan(svc: &Service, pods: &[Arc<CachedPod>], existing: &[Arc<EndpointSlice>]) -> Plan {
    plan_with_nodes(svc, pods, existing, &|_| NodeInfo::Unreadable)
}

/// Plans the slices of one Service. `existing` may contain slices of other controllers; only
/// managed ones are considered. Services without a selector or of type ExternalName get none.
/// `node_of` tells what is known of each Pod's Node: its zone goes into the endpoint, and a Pod
/// whose Node is known to be missing is left out (unless publishNotReadyAddresses).
pub fn plan_with_nodes(
    svc: &Service,
    pods: &[Arc<CachedPod>],
    existing: &[Arc<EndpointSlice>],
    node_of: NodeOf<'_>,
) -> Plan {
    let mut managed: Vec<&EndpointSlice> = existing
        .iter()
        .map(Arc::as_ref)
        .filter(|s| is_managed(s))
        .collect();
    managed.sort_by_key(|s| s.name_any());
    let external_name = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
    if endpointutil::service_selector(svc).is_none() || external_name {
        return Plan {
            delete: managed.into_iter().cloned().collect(),
            ..Plan::default()
        };
    }
    let mut plan = Plan::default();
    let mut unchanged = Vec::new();
    let mut total = 0;
    for at in address_types(svc) {
        let mut want = desired(svc, pods, &at, node_of);
        total += want.values().map(|(_, e)| e.len()).sum::<usize>();
        // As upstream: a slice owned by another Service object (an earlier one of the same name)
        // is deleted, not edited into this one's.
        let (of_type, not_owned): (Vec<&EndpointSlice>, Vec<&EndpointSlice>) = managed
            .iter()
            .copied()
            .filter(|s| s.address_type == at)
            .partition(|s| owned_by(svc, s));
        plan.delete.extend(not_owned.into_iter().cloned());
        let mut typed_unchanged = Vec::new();
        keep_existing(svc, of_type, &mut want, &mut plan, &mut typed_unchanged);
        place_remaining(svc, &at, want, &mut plan, &mut typed_unchanged);
        unchanged.extend(typed_unchanged);
    }
    for s in managed
        .iter()
        .filter(|s| !address_types(svc).contains(&s.address_type))
    {
        plan.delete.push((*s).clone());
    }
    if total == 0 {
        keep_placeholder(svc, &mut plan, &unchanged);
    }
    reuse_deleted(svc, &mut plan);
    plan
}

/// Upstream's `finalize`: a slice to create takes over a slice to delete of the same address type
/// that this Service owns, as an update of it: one write instead of two, and no moment where both
/// exist (a placeholder that gets endpoints stays the Service's only slice). A slice owned by an
/// earlier Service of the same name is not reused: it is being deleted for that Service.
fn reuse_deleted(svc: &Service, plan: &mut Plan) {
    let mut i = 0;
    while i < plan.delete.len() {
        let Some(created) = plan.create.last() else {
            return;
        };
        let old = &plan.delete[i];
        if old.address_type != created.address_type || !owned_by(svc, old) {
            i += 1;
            continue;
        }
        let created = plan.create.pop().expect("checked above");
        let mut slice = with_metadata(svc, plan.delete.remove(i));
        slice.endpoints = created.endpoints;
        slice.ports = created.ports;
        plan.update.push(slice);
    }
}

/// Step 1: edit existing slices in place; endpoints they keep leave `want`.
fn keep_existing(
    svc: &Service,
    slices: Vec<&EndpointSlice>,
    want: &mut Desired,
    plan: &mut Plan,
    unchanged: &mut Vec<EndpointSlice>,
) {
    for slice in slices {
        let ports = slice.ports.clone().unwrap_or_default();
        let Some((_, wanted)) = want.get_mut(&port_key(&ports)) else {
            plan.delete.push(slice.clone());
            continue;
        };
        let mut changed = !metadata_current(svc, slice);
        let mut kept = Vec::with_capacity(endpoints_of(slice).len());
        for ep in endpoints_of(slice) {
            match ep.addresses.first().and_then(|a| wanted.remove(a)) {
                Some(d) => {
                    changed |= &d != ep;
                    kept.push(d);
                }
                None => changed = true,
            }
        }
        if kept.is_empty() {
            plan.delete.push(slice.clone());
        } else if changed {
            let mut s = with_metadata(svc, slice.clone());
            s.endpoints = kept;
            plan.update.push(s);
        } else {
            unchanged.push(slice.clone());
        }
    }
}

/// Steps 2 and 3: remaining endpoints fill slices already being updated, then unchanged slices with
/// room (fullest first), then new slices.
fn place_remaining(
    svc: &Service,
    at: &str,
    want: Desired,
    plan: &mut Plan,
    unchanged: &mut Vec<EndpointSlice>,
) {
    for (pk, (ports, eps)) in want {
        let mut rest: Vec<Endpoint> = eps.into_values().collect();
        if rest.is_empty() {
            continue;
        }
        for s in plan
            .update
            .iter_mut()
            .filter(|s| s.address_type == at && port_key(s.ports.as_deref().unwrap_or(&[])) == pk)
        {
            let room = MAX_ENDPOINTS_PER_SLICE
                .saturating_sub(endpoints_of(s).len())
                .min(rest.len());
            endpoints_mut(s).extend(rest.drain(..room));
        }
        if rest.is_empty() {
            continue;
        }
        fill_unchanged(&pk, &mut rest, plan, unchanged);
        while !rest.is_empty() {
            let chunk: Vec<Endpoint> = rest
                .drain(..rest.len().min(MAX_ENDPOINTS_PER_SLICE))
                .collect();
            plan.create.push(new_slice(svc, at, ports.clone(), chunk));
        }
    }
}

/// Moves endpoints into unchanged slices with room, fullest first (each becomes an update), so new
/// slices are made only when the existing ones are full.
fn fill_unchanged(
    pk: &PortKey,
    rest: &mut Vec<Endpoint>,
    plan: &mut Plan,
    unchanged: &mut Vec<EndpointSlice>,
) {
    while !rest.is_empty() {
        let fullest = unchanged
            .iter()
            .enumerate()
            .filter(|(_, s)| port_key(s.ports.as_deref().unwrap_or(&[])) == *pk)
            .filter(|(_, s)| endpoints_of(s).len() < MAX_ENDPOINTS_PER_SLICE)
            .max_by_key(|(_, s)| endpoints_of(s).len())
            .map(|(i, _)| i);
        let Some(i) = fullest else { return };
        let mut s = unchanged.remove(i);
        let room = (MAX_ENDPOINTS_PER_SLICE - endpoints_of(&s).len()).min(rest.len());
        endpoints_mut(&mut s).extend(rest.drain(..room));
        plan.update.push(s);
    }
}

/// A Service with no endpoints keeps exactly one empty slice, so consumers can tell "no endpoints"
/// from "not synced yet".
fn keep_placeholder(svc: &Service, plan: &mut Plan, unchanged: &[EndpointSlice]) {
    if !plan.create.is_empty() || !plan.update.is_empty() || !unchanged.is_empty() {
        return;
    }
    let at = address_types(svc).remove(0);
    let is_placeholder = |s: &EndpointSlice| {
        endpoints_of(s).is_empty()
            && s.ports.as_ref().is_none_or(|p| p.is_empty())
            && s.address_type == at
    };
    if let Some(i) = plan
        .delete
        .iter()
        .position(|s| is_placeholder(s) && metadata_current(svc, s))
    {
        plan.delete.remove(i);
        return;
    }
    if let Some(i) = plan
        .delete
        .iter()
        .position(|s| s.address_type == at && owned_by(svc, s))
    {
        let mut s = with_metadata(svc, plan.delete.remove(i));
        s.endpoints = Vec::new();
        s.ports = Some(Vec::new());
        plan.update.push(s);
        return;
    }
    plan.create
        .push(new_slice(svc, &at, Vec::new(), Vec::new()));
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
