//! Conversion of Kubernetes Service and EndpointSlice objects into the proxy's model, with
//! validation that names the object and the field of every problem.
//!
//! Owns: which Services are proxied at all (headless, ExternalName and other proxies' Services are
//! not), the parsing of addresses and ports, and the normalisation of sloppy input (IPv4 with leading
//! zeros). A bad port of a Service drops that port only; the Service's other ports stay.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::error::InvalidObject;
use crate::model::{
    merge_endpoints, Algorithm, Endpoint, Hints, Name, Protocol, ServicePort, ServicePortName,
    ALGORITHM_ANNOTATION,
};

/// Services carrying this label belong to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Services carrying this label (any value) are not proxied, whatever their clusterIP: kube-proxy
/// leaves them out of its watch, and upstream's e2e suite checks that they stop answering.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// kube-proxy's default session affinity timeout.
pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10800);

/// The result of converting one Service: the ports that are usable and the problems found.
#[derive(Debug, Default)]
pub struct ConvertedService {
    pub ports: Vec<Arc<ServicePort>>,
    pub errors: Vec<InvalidObject>,
    /// Why the proxy does not handle it ([`skip_reason`]), if it does not.
    pub skipped: Option<&'static str>,
}

/// The endpoints an EndpointSlice contributes, per port of its Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceInfo {
    pub namespace: Arc<str>,
    /// The Service this slice belongs to (`kubernetes.io/service-name`).
    pub service: Arc<str>,
    /// (port name, protocol, port number) as the slice lists them; names pooled (a cluster has
    /// few: `http`, `dns`, ...).
    pub ports: Box<[(Arc<str>, Protocol, u16)]>,
    /// The endpoints. When `ports` lists exactly one port (nearly every slice), they carry it and
    /// are that port's list as the tracker would build it ([`merge_endpoints`]: sorted by
    /// address, duplicates merged), so a Service with this one slice programs this very list
    /// instead of a copy. Otherwise their port is 0 and comes from `ports`.
    pub endpoints: Arc<[Endpoint]>,
}

/// (namespace, name) of an object; a missing namespace is `default`, as the API server defaults it.
/// Shared strings: a namespace is one pooled string for all its objects, and a Service's name is
/// the same string in its key and in each of its ports' [`ServicePortName`].
pub type ObjectKey = (Arc<str>, Arc<str>);

/// The [`ObjectKey`] of an object's metadata.
pub fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    (
        shared_name(meta.namespace.as_deref().unwrap_or("default")),
        meta.name.as_deref().unwrap_or_default().into(),
    )
}

/// A Service reduced, as soon as a source reads it, to what the proxy keeps of it. The source
/// drops the Kubernetes object right after, so a listing of many Services never exists as whole
/// objects (a Service with its managedFields is several times the size of its ports).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceEntry {
    pub key: ObjectKey,
    /// The proxied ports; empty for a Service the proxy does not handle. Made shared here, as
    /// the tracker and the state keep them, so that applying the entry moves them instead of
    /// copying each 184-byte port into a new allocation (and leaving the old one a hole).
    pub ports: Box<[Arc<ServicePort>]>,
    pub errors: Vec<InvalidObject>,
    /// Why the proxy does not handle it ([`skip_reason`]), for the log.
    pub skipped: Option<&'static str>,
}

impl ServiceEntry {
    /// Converts `svc`; `default_algorithm` is the node's `--balance`.
    pub fn new(svc: &Service, default_algorithm: Algorithm) -> ServiceEntry {
        let key = key_of(&svc.metadata);
        let converted = convert_keyed(svc, &key, default_algorithm);
        ServiceEntry {
            key,
            ports: converted.ports.into_boxed_slice(),
            errors: converted.errors,
            skipped: converted.skipped,
        }
    }
}

/// An EndpointSlice reduced, as soon as a source reads it, to what the proxy keeps of it.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceEntry {
    pub key: ObjectKey,
    /// `None` for a slice that contributes nothing (no Service label, FQDN).
    pub info: Option<SliceInfo>,
    pub errors: Vec<InvalidObject>,
}

impl SliceEntry {
    pub fn new(slice: &EndpointSlice) -> SliceEntry {
        let (info, errors) = convert_slice(slice);
        SliceEntry {
            key: key_of(&slice.metadata),
            info,
            errors,
        }
    }
}

fn invalid(
    kind: &str,
    object: &str,
    field: impl Into<String>,
    message: impl Into<String>,
) -> InvalidObject {
    InvalidObject {
        file: None,
        kind: kind.to_string(),
        object: object.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

/// `namespace/name` of an object's metadata.
pub fn object_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("<unnamed>")
    )
}

/// Parses an IP address, accepting IPv4 written with leading zeros by old clients ("010.096.0.1"),
/// which Kubernetes reads as decimal.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.trim().parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = s.trim().split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// A pool of shared strings: one copy of each distinct name, handed out to every holder. Names
/// nothing else holds any more are dropped whenever the pool has doubled since it was last
/// pruned, so names that come and go do not accumulate.
struct Pool<T> {
    names: BTreeSet<T>,
    prune_at: usize,
}

impl<T: Ord + Clone + std::borrow::Borrow<str>> Pool<T> {
    const fn new() -> Self {
        Pool {
            names: BTreeSet::new(),
            prune_at: 0,
        }
    }

    fn get(&mut self, s: &str, make: impl FnOnce(&str) -> T, holders: impl Fn(&T) -> usize) -> T {
        if let Some(name) = self.names.get(s) {
            return name.clone();
        }
        if self.names.len() >= self.prune_at {
            self.names.retain(|n| holders(n) > 1);
            self.prune_at = (self.names.len() * 2).max(1024);
        }
        let name = make(s);
        self.names.insert(name.clone());
        name
    }
}

/// One shared copy of each namespace and port name. A cluster has few of each, while every
/// object names its namespace; without this each would hold its own string.
fn shared_name(s: &str) -> Arc<str> {
    static POOL: Mutex<Pool<Arc<str>>> = Mutex::new(Pool::new());
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    pool.get(s, |s| Arc::from(s), Arc::strong_count)
}

/// One shared copy of each node and zone name, as endpoints and their hints hold them.
fn shared_label(s: &str) -> Name {
    static POOL: Mutex<Pool<Name>> = Mutex::new(Pool::new());
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    pool.get(s, Name::new, Name::holders)
}

fn port_u16(value: i32) -> Option<u16> {
    u16::try_from(value).ok().filter(|p| *p != 0)
}

/// [`skip_reason`] of a Service that has no clusterIP: the API server always allocates one (or
/// writes `None`), so only a Service written by hand (a manifest file) can lack it.
pub const NO_CLUSTER_IP: &str = "no clusterIP allocated";

/// Whether the proxy handles this Service at all. Returns why not, for the log, when it doesn't.
pub fn skip_reason(svc: &Service) -> Option<&'static str> {
    let spec = svc.spec.as_ref()?;
    for (label, why) in [
        (
            SERVICE_PROXY_NAME_LABEL,
            "labelled for another proxy (service.kubernetes.io/service-proxy-name)",
        ),
        (
            HEADLESS_LABEL,
            "labelled headless (service.kubernetes.io/headless)",
        ),
    ] {
        if svc
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(label))
        {
            return Some(why);
        }
    }
    if spec.type_.as_deref() == Some("ExternalName") {
        return Some("type ExternalName");
    }
    match spec.cluster_ip.as_deref() {
        Some("None") => Some("headless (clusterIP None)"),
        None | Some("") => Some(NO_CLUSTER_IP),
        _ => None,
    }
}

/// Converts a Service into its proxied ports. `default_algorithm` is the node's `--balance`.
pub fn convert_service(svc: &Service, default_algorithm: Algorithm) -> ConvertedService {
    convert_keyed(svc, &key_of(&svc.metadata), default_algorithm)
}

/// [`convert_service`] with the Service's key, whose strings its ports' names share.
fn convert_keyed(svc: &Service, key: &ObjectKey, default_algorithm: Algorithm) -> ConvertedService {
    let mut out = ConvertedService::default();
    let obj = object_name(&svc.metadata);
    let Some(spec) = svc.spec.as_ref() else {
        out.errors.push(invalid("Service", &obj, "spec", "missing"));
        return out;
    };
    out.skipped = skip_reason(svc);
    if out.skipped.is_some() {
        return out;
    }
    let cluster_ips = service_ips(&obj, spec, &mut out.errors);
    if cluster_ips.is_empty() {
        return out;
    }
    let common = CommonFields::from_service(&obj, svc, key, default_algorithm, &mut out.errors);
    // Kept for the Service's lifetime: exactly as many as it has, so the entry's boxed slice is
    // this very allocation.
    out.ports
        .reserve_exact(spec.ports.as_ref().map_or(0, Vec::len));
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        match convert_port(&obj, i, p, &cluster_ips, &common) {
            Ok(sp) => out.ports.push(Arc::new(sp)),
            Err(e) => out.errors.push(e),
        }
    }
    out
}

fn service_ips(
    obj: &str,
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    errors: &mut Vec<InvalidObject>,
) -> Vec<IpAddr> {
    let raw: Vec<(String, &str)> = match spec.cluster_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("spec.clusterIPs[{i}]"), s.as_str()))
            .collect(),
        None => spec
            .cluster_ip
            .iter()
            .map(|s| ("spec.clusterIP".to_string(), s.as_str()))
            .collect(),
    };
    let mut ips = Vec::new();
    for (field, s) in raw {
        match parse_ip_sloppy(s) {
            Some(ip) if !ips.contains(&ip) => ips.push(ip),
            Some(_) => {}
            None => errors.push(invalid(
                "Service",
                obj,
                field,
                format!("{s:?} is not an IP address"),
            )),
        }
    }
    ips
}

/// Fields shared by every port of a Service.
struct CommonFields {
    /// The Service's namespace and name, allocated once for all its ports.
    namespace: Arc<str>,
    name: Arc<str>,
    external_ips: Vec<IpAddr>,
    load_balancer_ips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    affinity: Option<Duration>,
    external_local: bool,
    internal_local: bool,
    health_check_node_port: u16,
    algorithm: Algorithm,
}

impl CommonFields {
    fn from_service(
        obj: &str,
        svc: &Service,
        key: &ObjectKey,
        default_algorithm: Algorithm,
        errors: &mut Vec<InvalidObject>,
    ) -> Self {
        let spec = svc.spec.as_ref().expect("checked by caller");
        let (namespace, name) = key.clone();
        let mut external_ips = Vec::new();
        for (i, s) in spec.external_ips.iter().flatten().enumerate() {
            match parse_ip_sloppy(s) {
                Some(ip) => external_ips.push(ip),
                None => errors.push(invalid(
                    "Service",
                    obj,
                    format!("spec.externalIPs[{i}]"),
                    format!("{s:?} is not an IP address"),
                )),
            }
        }
        let mut load_balancer_ips = Vec::new();
        let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate().filter(|_| is_lb) {
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(s) = ing.ip.as_deref() {
                match parse_ip_sloppy(s) {
                    Some(ip) => load_balancer_ips.push(ip),
                    None => errors.push(invalid(
                        "Service",
                        obj,
                        format!("status.loadBalancer.ingress[{i}].ip"),
                        format!("{s:?} is not an IP address"),
                    )),
                }
            }
        }
        let mut source_ranges = Vec::new();
        for (i, s) in spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .enumerate()
        {
            match s
                .trim()
                .parse::<IpNet>()
                .or_else(|_| s.trim().parse::<IpAddr>().map(IpNet::from))
            {
                Ok(net) => source_ranges.push(net.trunc()),
                Err(_) => errors.push(invalid(
                    "Service",
                    obj,
                    format!("spec.loadBalancerSourceRanges[{i}]"),
                    format!("{s:?} is not a CIDR"),
                )),
            }
        }
        let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            let secs = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .filter(|s| *s > 0);
            secs.map(|s| Duration::from_secs(s as u64))
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
        });
        let algorithm = match svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ALGORITHM_ANNOTATION))
        {
            None => default_algorithm,
            Some(v) => Algorithm::parse(v).unwrap_or_else(|| {
                errors.push(invalid(
                    "Service",
                    obj,
                    format!("metadata.annotations[{ALGORITHM_ANNOTATION}]"),
                    format!(
                        "{v:?} is not round-robin, least-conn or maglev; using {default_algorithm}"
                    ),
                ));
                default_algorithm
            }),
        };
        let has_external = spec
            .type_
            .as_deref()
            .is_some_and(|t| t == "NodePort" || t == "LoadBalancer")
            || !external_ips.is_empty();
        CommonFields {
            namespace,
            name,
            external_ips,
            load_balancer_ips,
            source_ranges,
            affinity,
            external_local: has_external
                && spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            health_check_node_port: spec.health_check_node_port.and_then(port_u16).unwrap_or(0),
            algorithm,
        }
    }
}

fn convert_port(
    obj: &str,
    i: usize,
    p: &k8s_openapi::api::core::v1::ServicePort,
    cluster_ips: &[IpAddr],
    c: &CommonFields,
) -> Result<ServicePort, InvalidObject> {
    let protocol = Protocol::parse(p.protocol.as_deref()).ok_or_else(|| {
        invalid(
            "Service",
            obj,
            format!("spec.ports[{i}].protocol"),
            format!(
                "{:?} is not TCP, UDP or SCTP",
                p.protocol.as_deref().unwrap_or("")
            ),
        )
    })?;
    let port = port_u16(p.port).ok_or_else(|| {
        invalid(
            "Service",
            obj,
            format!("spec.ports[{i}].port"),
            format!("{} is outside 1-65535", p.port),
        )
    })?;
    let node_port = match p.node_port {
        None | Some(0) => 0,
        Some(n) => port_u16(n).ok_or_else(|| {
            invalid(
                "Service",
                obj,
                format!("spec.ports[{i}].nodePort"),
                format!("{n} is outside 1-65535"),
            )
        })?,
    };
    Ok(ServicePort {
        name: ServicePortName::new(
            c.namespace.clone(),
            c.name.clone(),
            shared_name(p.name.as_deref().unwrap_or_default()),
            protocol,
        ),
        cluster_ips: cluster_ips.to_vec(),
        port,
        protocol,
        node_port,
        external_ips: c.external_ips.clone(),
        load_balancer_ips: c.load_balancer_ips.clone(),
        source_ranges: c.source_ranges.clone(),
        affinity: c.affinity,
        external_local: c.external_local,
        internal_local: c.internal_local,
        health_check_node_port: c.health_check_node_port,
        algorithm: c.algorithm,
    })
}

/// Converts an EndpointSlice. Bad endpoints and ports are reported and skipped; the rest is kept.
pub fn convert_slice(slice: &EndpointSlice) -> (Option<SliceInfo>, Vec<InvalidObject>) {
    let obj = object_name(&slice.metadata);
    let mut errors = Vec::new();
    let Some(service) = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .cloned()
    else {
        errors.push(invalid(
            "EndpointSlice",
            &obj,
            format!("metadata.labels[{SERVICE_NAME_LABEL}]"),
            "missing: the slice belongs to no Service",
        ));
        return (None, errors);
    };
    if slice.address_type == "FQDN" {
        return (None, errors);
    }
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            errors.push(invalid(
                "EndpointSlice",
                &obj,
                format!("ports[{i}].protocol"),
                format!(
                    "{:?} is not TCP, UDP or SCTP",
                    p.protocol.as_deref().unwrap_or("")
                ),
            ));
            continue;
        };
        match p.port.and_then(port_u16) {
            Some(port) => {
                ports.push((shared_name(p.name.as_deref().unwrap_or("")), protocol, port))
            }
            None => errors.push(invalid(
                "EndpointSlice",
                &obj,
                format!("ports[{i}].port"),
                format!("{:?} is outside 1-65535", p.port),
            )),
        }
    }
    // A slice of one port (nearly all) keeps its endpoints with that port (see `SliceInfo`).
    let single_port = match ports.as_slice() {
        [(_, _, port)] => Some(*port),
        _ => None,
    };
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().enumerate() {
        let Some(first) = e.addresses.first() else {
            errors.push(invalid(
                "EndpointSlice",
                &obj,
                format!("endpoints[{i}].addresses"),
                "empty",
            ));
            continue;
        };
        let Some(addr) = parse_ip_sloppy(first) else {
            errors.push(invalid(
                "EndpointSlice",
                &obj,
                format!("endpoints[{i}].addresses[0]"),
                format!("{first:?} is not an IP address"),
            ));
            continue;
        };
        let family_ok = match slice.address_type.as_str() {
            "IPv4" => addr.is_ipv4(),
            "IPv6" => addr.is_ipv6(),
            _ => true,
        };
        if !family_ok {
            errors.push(invalid(
                "EndpointSlice",
                &obj,
                format!("endpoints[{i}].addresses[0]"),
                format!("{addr} does not match addressType {}", slice.address_type),
            ));
            continue;
        }
        let cond = e.conditions.as_ref();
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
        let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
        endpoints.push(Endpoint {
            addr,
            port: single_port.unwrap_or(0),
            node: e.node_name.as_deref().map(shared_label),
            zone: e.zone.as_deref().map(shared_label),
            ready,
            serving,
            terminating,
            hints: hints_of(e.hints.as_ref()),
        });
    }
    let endpoints: Arc<[Endpoint]> = match single_port {
        Some(_) => merge_endpoints(endpoints).into(),
        None => endpoints.into(),
    };
    let namespace = shared_name(slice.metadata.namespace.as_deref().unwrap_or("default"));
    (
        Some(SliceInfo {
            namespace,
            service: service.into(),
            ports: ports.into(),
            endpoints,
        }),
        errors,
    )
}

/// An endpoint's topology hints, `None` when it has neither zone nor node hints.
fn hints_of(h: Option<&k8s_openapi::api::discovery::v1::EndpointHints>) -> Option<Arc<Hints>> {
    let h = h?;
    let zones: Box<[Name]> = h
        .for_zones
        .iter()
        .flatten()
        .map(|z| shared_label(&z.name))
        .collect();
    let nodes: Box<[Name]> = h
        .for_nodes
        .iter()
        .flatten()
        .map(|n| shared_label(&n.name))
        .collect();
    (!zones.is_empty() || !nodes.is_empty()).then(|| Arc::new(Hints { zones, nodes }))
}

#[cfg(test)]
mod tests;
