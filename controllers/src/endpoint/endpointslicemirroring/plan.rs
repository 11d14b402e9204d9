//! The mirroring plan: from a custom Endpoints object and the slices mirrored from it so far,
//! which EndpointSlices to create, update and delete. Pure functions only; the apply layer lives
//! in `super`.
//!
//! Follows kube-controller-manager's `endpointslicemirroring` reconciler: the subsets are
//! repacked first (an address in several subsets with the same ports is one endpoint; not ready
//! wins over ready), each subset's addresses are split by family, and each (family, port set) is
//! one slice of at most `max_endpoints_per_subset` endpoints (ready addresses first; the rest are
//! skipped and counted). An existing slice of the same (family, port set) is kept and rewritten
//! only when its endpoints, labels, annotations or owner differ; further ones are deleted; a slice
//! to create and one to delete of the same family become one update (upstream's `recycleSlices`).
//! Addresses that are not IPs are skipped and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort as CorePort, Endpoints};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

/// `discovery.LabelServiceName`.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// `discovery.LabelManagedBy`.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The managed-by value of mirrored slices (upstream's `ControllerName`).
pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
/// `discovery.LabelSkipMirror`: Endpoints labelled `"true"` are not mirrored.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// `resourcelock.LeaderElectionRecordAnnotationKey`: leader-election Endpoints are not mirrored.
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
/// Annotations of the Endpoints not copied to its slices.
const NOT_COPIED: [&str; 2] = [
    "endpoints.kubernetes.io/last-change-trigger-time",
    "kubectl.kubernetes.io/last-applied-configuration",
];

/// Whether `endpoints` is to be mirrored at all (upstream's `shouldMirror`).
pub fn should_mirror(endpoints: &Endpoints) -> bool {
    endpoints
        .labels()
        .get(LABEL_SKIP_MIRROR)
        .map(String::as_str)
        != Some("true")
        && !endpoints.annotations().contains_key(LEADER_ANNOTATION)
}

/// Whether a slice was mirrored here.
pub fn is_mirrored(slice: &EndpointSlice) -> bool {
    slice.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
}

/// What to write.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// New slices (with `generateName`).
    pub create: Vec<EndpointSlice>,
    /// Whole slices to write over existing ones (named, with the resourceVersion read).
    pub update: Vec<EndpointSlice>,
    /// Existing slices to delete.
    pub delete: Vec<Arc<EndpointSlice>>,
    /// Addresses that are not IPs.
    pub invalid: usize,
    /// Addresses left out: not IPs, or past `max_endpoints_per_subset`.
    pub skipped: usize,
}

impl Plan {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// `ipv4` / `ipv6` of an address (`discovery.AddressType`).
fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// An address as upstream's `ParseIPSloppy` + `String()`: IPv4-mapped IPv6 counts as IPv4.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

fn to_slice_ports(ports: &[CorePort]) -> Vec<EndpointPort> {
    ports
        .iter()
        .map(|p| EndpointPort {
            name: Some(p.name.clone().unwrap_or_default()),
            port: Some(p.port),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            app_protocol: p.app_protocol.clone(),
        })
        .collect()
}

/// A port set's key, independent of order.
fn port_key(ports: &[EndpointPort]) -> BTreeSet<(String, i32, String, String)> {
    ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or(0),
                p.protocol.clone().unwrap_or_default(),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect()
}

type SliceKey = (&'static str, BTreeSet<(String, i32, String, String)>);

/// One repacked subset: its ports and its addresses with their readiness, in first-seen order.
struct Subset {
    ports: Vec<CorePort>,
    addresses: Vec<(EndpointAddress, bool)>,
}

/// Upstream's `RepackSubsets`: addresses keyed by (IP, targetRef uid); per port (or no port),
/// each address's readiness (not ready wins); addresses grouped by the set of ports they share.
fn repack(subsets: &[k8s_openapi::api::core::v1::EndpointSubset]) -> Vec<Subset> {
    type AddrKey = (String, String);
    let mut addrs: Vec<(AddrKey, EndpointAddress)> = Vec::new();
    // port (None: a subset without ports) -> address index -> ready
    let mut by_port: Vec<(Option<CorePort>, BTreeMap<usize, bool>)> = Vec::new();
    for subset in subsets {
        let ports: Vec<Option<CorePort>> = match subset.ports.as_deref() {
            None | Some([]) => vec![None],
            Some(ps) => ps.iter().cloned().map(Some).collect(),
        };
        let listed = subset.addresses.iter().flatten().map(|a| (a, true)).chain(
            subset
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| (a, false)),
        );
        for (addr, ready) in listed {
            let key = (
                addr.ip.clone(),
                addr.target_ref
                    .as_ref()
                    .and_then(|r| r.uid.clone())
                    .unwrap_or_default(),
            );
            let idx = match addrs.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    addrs.push((key, addr.clone()));
                    addrs.len() - 1
                }
            };
            for port in &ports {
                let pos = match by_port.iter().position(|(p, _)| p == port) {
                    Some(i) => i,
                    None => {
                        by_port.push((port.clone(), BTreeMap::new()));
                        by_port.len() - 1
                    }
                };
                let entry = by_port[pos].1.entry(idx).or_insert(ready);
                if *entry {
                    *entry = ready;
                }
            }
        }
    }
    // Ports sharing the same addresses (and readiness) form one subset.
    let mut groups: Vec<(BTreeMap<usize, bool>, Vec<CorePort>)> = Vec::new();
    for (port, set) in by_port {
        let pos = match groups.iter().position(|(s, _)| *s == set) {
            Some(i) => i,
            None => {
                groups.push((set, Vec::new()));
                groups.len() - 1
            }
        };
        if let Some(p) = port.filter(|p| p.port > 0) {
            groups[pos].1.push(p);
        }
    }
    groups
        .into_iter()
        .map(|(set, ports)| {
            // Ready addresses first, as upstream's subset lists them.
            let mut addresses: Vec<(EndpointAddress, bool)> = set
                .iter()
                .filter(|(_, r)| **r)
                .map(|(i, r)| (addrs[*i].1.clone(), *r))
                .collect();
            addresses.extend(
                set.iter()
                    .filter(|(_, r)| !**r)
                    .map(|(i, r)| (addrs[*i].1.clone(), *r)),
            );
            Subset { ports, addresses }
        })
        .collect()
}

fn to_endpoint(addr: &EndpointAddress, ip: IpAddr, ready: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            ..Default::default()
        }),
        target_ref: addr.target_ref.clone(),
        node_name: addr.node_name.clone(),
        hostname: addr.hostname.clone().filter(|h| !h.is_empty()),
        ..Default::default()
    }
}

/// The labels and annotations a slice of `endpoints` carries.
fn slice_meta(endpoints: &Endpoints) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = endpoints.labels().clone();
    labels.insert(LABEL_SERVICE_NAME.into(), endpoints.name_any());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    let mut annotations = endpoints.annotations().clone();
    for k in NOT_COPIED {
        annotations.remove(k);
    }
    (labels, annotations)
}

fn owner(endpoints: &Endpoints) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Endpoints".into(),
        name: endpoints.name_any(),
        uid: endpoints.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn new_slice(
    endpoints: &Endpoints,
    family: &str,
    ports: Vec<EndpointPort>,
    eps: Vec<Endpoint>,
) -> EndpointSlice {
    let (labels, annotations) = slice_meta(endpoints);
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", endpoints.name_any())),
            namespace: endpoints.namespace(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner(endpoints)]),
            ..Default::default()
        },
        address_type: family.into(),
        endpoints: eps,
        ports: Some(ports),
    }
}

/// Endpoints as a sorted list of their JSON, to compare sets.
fn endpoint_set(eps: &[Endpoint]) -> Vec<String> {
    let mut v: Vec<String> = eps
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect();
    v.sort();
    v
}

/// Whether `existing` already is what a slice of `endpoints` with `eps` would be (upstream's
/// `totalChanges` + labels, annotations and `needRebuildExistingSlices`).
fn up_to_date(endpoints: &Endpoints, existing: &EndpointSlice, eps: &[Endpoint]) -> bool {
    let (labels, annotations) = slice_meta(endpoints);
    let owner_changed = existing.owner_references().iter().any(|o| {
        o.kind == "Endpoints"
            && o.name == endpoints.name_any()
            && Some(&o.uid) != endpoints.uid().as_ref()
    });
    endpoint_set(&existing.endpoints) == endpoint_set(eps)
        && existing.labels() == &labels
        && existing.annotations() == &annotations
        && !owner_changed
}

/// The plan for `endpoints` given the slices mirrored from it (`existing`).
pub fn plan(endpoints: &Endpoints, existing: &[Arc<EndpointSlice>], max_per_subset: usize) -> Plan {
    let mut plan = Plan::default();
    // Desired endpoints per (family, port set), in first-seen order of the keys.
    let mut desired: Vec<(SliceKey, Vec<EndpointPort>, Vec<Endpoint>)> = Vec::new();
    for subset in repack(endpoints.subsets.as_deref().unwrap_or_default()) {
        let ports = to_slice_ports(&subset.ports);
        for fam in ["IPv4", "IPv6"] {
            let key = (fam, port_key(&ports));
            if !desired.iter().any(|(k, _, _)| *k == key) {
                desired.push((key, ports.clone(), Vec::new()));
            }
        }
        let total = subset.addresses.len();
        let mut added = 0;
        for (addr, ready) in &subset.addresses {
            if added >= max_per_subset {
                break;
            }
            match parse_ip(&addr.ip) {
                Some(ip) => {
                    let key = (family(&ip), port_key(&ports));
                    let entry = desired
                        .iter_mut()
                        .find(|(k, _, _)| *k == key)
                        .expect("keyed");
                    entry.2.push(to_endpoint(addr, ip, *ready));
                    added += 1;
                }
                None => plan.invalid += 1,
            }
        }
        plan.skipped += total - added;
    }
    // Existing slices by key, oldest name first for a stable choice of the one kept.
    let mut existing: Vec<&Arc<EndpointSlice>> = existing.iter().collect();
    existing.sort_by_key(|s| s.name_any());
    let key_of = |s: &EndpointSlice| -> Option<SliceKey> {
        let fam = match s.address_type.as_str() {
            "IPv4" => "IPv4",
            "IPv6" => "IPv6",
            _ => return None,
        };
        Some((fam, port_key(s.ports.as_deref().unwrap_or_default())))
    };
    for (key, ports, mut eps) in desired.iter().cloned() {
        let mine: Vec<&Arc<EndpointSlice>> = existing
            .iter()
            .copied()
            .filter(|s| key_of(s).as_ref() == Some(&key))
            .collect();
        if eps.is_empty() {
            plan.delete.extend(mine.into_iter().cloned());
            continue;
        }
        eps.truncate(max_per_subset);
        match mine.split_first() {
            None => plan.create.push(new_slice(endpoints, key.0, ports, eps)),
            Some((first, rest)) => {
                plan.delete.extend(rest.iter().map(|s| (*s).clone()));
                if !up_to_date(endpoints, first, &eps) {
                    let mut s = new_slice(endpoints, key.0, ports, eps);
                    s.metadata.generate_name = None;
                    s.metadata.name = first.metadata.name.clone();
                    s.metadata.resource_version = first.metadata.resource_version.clone();
                    plan.update.push(s);
                }
            }
        }
    }
    // Slices of keys no longer wanted (other ports, other family, unknown address type).
    for s in &existing {
        let wanted = key_of(s).is_some_and(|k| desired.iter().any(|(d, _, _)| *d == k));
        if !wanted {
            plan.delete.push((*s).clone());
        }
    }
    recycle(&mut plan);
    plan
}

/// Upstream's `recycleSlices`: a slice to create and one to delete of the same family become an
/// update of the latter.
fn recycle(plan: &mut Plan) {
    let mut i = 0;
    while i < plan.create.len() {
        let fam = plan.create[i].address_type.clone();
        if let Some(d) = plan.delete.iter().position(|s| s.address_type == fam) {
            let old = plan.delete.remove(d);
            let mut s = plan.create.remove(i);
            s.metadata.generate_name = None;
            s.metadata.name = old.metadata.name.clone();
            s.metadata.resource_version = old.metadata.resource_version.clone();
            plan.update.push(s);
        } else {
            i += 1;
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
