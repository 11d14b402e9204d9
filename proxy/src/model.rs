//! The proxy's view of Services and endpoints: the types every other module speaks.
//!
//! Owns: `ServicePortName` (the unit of change), `ServicePort` (everything a dataplane needs to know
//! about one port of one Service) and `Endpoint`. Conversion from Kubernetes objects lives in
//! `convert`; this module has no I/O and no Kubernetes types.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(ip: &std::net::IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// Transport protocol of a Service port (TCP when a Service does not say, as in Kubernetes).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The lower-case spelling nft, iptables and conntrack use.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Whether stale conntrack entries of this protocol are cleaned when endpoints change or a
    /// port becomes reachable, as kube-proxy does: UDP and SCTP; never TCP, whose entries end
    /// with their connections.
    pub fn conntrack_cleaned(self) -> bool {
        matches!(self, Protocol::Udp | Protocol::Sctp)
    }

    /// Parses the Kubernetes spelling; `None` (absent) means TCP as in the API defaults.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s {
            None | Some("TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some("SCTP") => Some(Protocol::Sctp),
            Some(_) => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one port of one Service: the unit the change tracker and the dataplanes work in.
///
/// It keys the tracker's state, the change sets and every backend's bookkeeping, so each Service
/// port's name is held four or five times: it is one pointer to one shared [`PortNameParts`]
/// (a clone allocates nothing), not the 56 bytes of its parts per holder, which at 100,000
/// Services were 20 MB of copies (docs/BENCHMARKS.md). Compared, ordered and hashed by its parts;
/// its fields read through `Deref`, and writing one (tests do) copies the parts first if they are
/// shared.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName(Arc<PortNameParts>);

/// What a [`ServicePortName`] names. Its own names are shared too (`Arc<str>`): a Service's name
/// is the one string of its key and of each of its ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortNameParts {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port_name: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        port_name: impl Into<Arc<str>>,
        protocol: Protocol,
    ) -> Self {
        ServicePortName(Arc::new(PortNameParts {
            namespace: namespace.into(),
            name: name.into(),
            port_name: port_name.into(),
            protocol,
        }))
    }
}

impl std::ops::Deref for ServicePortName {
    type Target = PortNameParts;

    fn deref(&self) -> &PortNameParts {
        &self.0
    }
}

impl std::ops::DerefMut for ServicePortName {
    fn deref_mut(&mut self) -> &mut PortNameParts {
        Arc::make_mut(&mut self.0)
    }
}

impl fmt::Debug for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for ServicePortName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ServicePortName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PortNameParts::deserialize(d).map(|parts| ServicePortName(Arc::new(parts)))
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port_name.is_empty() {
            write!(f, "{}/{}/{}", self.namespace, self.name, self.protocol)
        } else {
            write!(
                f,
                "{}/{}:{}/{}",
                self.namespace, self.name, self.port_name, self.protocol
            )
        }
    }
}

/// Load-balancing algorithm, chosen per node (`--balance`) and per Service (annotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    #[default]
    RoundRobin,
    LeastConn,
    /// Maglev consistent hashing of the flow (the `maglev` module): the same flow picks the same
    /// endpoint on every node, and an endpoint's removal moves only about its own flows.
    Maglev,
}

impl Algorithm {
    /// Parses `round-robin` / `rr`, `least-conn` / `least-connection` / `lc` and `maglev`.
    pub fn parse(s: &str) -> Option<Algorithm> {
        match s.trim().to_ascii_lowercase().as_str() {
            "round-robin" | "roundrobin" | "rr" => Some(Algorithm::RoundRobin),
            "least-conn" | "least-connection" | "leastconn" | "lc" => Some(Algorithm::LeastConn),
            "maglev" => Some(Algorithm::Maglev),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round-robin",
            Algorithm::LeastConn => "least-conn",
            Algorithm::Maglev => "maglev",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The annotation by which a Service overrides the node's `--balance` algorithm.
pub const ALGORITHM_ANNOTATION: &str = "kpr.io/balance";

/// Everything a dataplane needs to know about one port of one Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    pub name: ServicePortName,
    /// clusterIPs of the Service (one per IP family).
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
    /// 0 when the Service has no node port for this port.
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, minus entries with `ipMode: Proxy`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`; empty means everyone.
    pub source_ranges: Vec<IpNet>,
    /// Session affinity ClientIP timeout; `None` without affinity.
    pub affinity: Option<Duration>,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// 0 when none.
    pub health_check_node_port: u16,
    /// The algorithm this Service port uses (node default unless annotated).
    pub algorithm: Algorithm,
}

impl ServicePort {
    /// Destinations that count as "external" (nodePort, externalIPs, LB IPs).
    pub fn has_external(&self) -> bool {
        self.node_port != 0 || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Whether the port has an address of `family` (a clusterIP, externalIP or load-balancer
    /// IP); its nodePort serves the families it has.
    pub fn has_family(&self, family: IpFamily) -> bool {
        [
            &self.cluster_ips,
            &self.external_ips,
            &self.load_balancer_ips,
        ]
        .into_iter()
        .flatten()
        .any(|ip| IpFamily::of(ip) == family)
    }
}

/// A node or zone name as endpoints hold it: one pointer (an `Arc<str>` is two) to one shared
/// copy of each distinct name (`convert` pools them). Endpoints are the most numerous thing the
/// agent keeps, and each names its node and zone: at 100,000 Services of 4 endpoints, the
/// pointers' second words alone were 6 MB (docs/BENCHMARKS.md).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<Box<str>>);

impl Name {
    pub fn new(s: &str) -> Name {
        Name(Arc::new(s.into()))
    }

    /// How many holders share this copy (the pool prunes names only it holds).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether two names are the same shared copy.
    pub fn ptr_eq(a: &Name, b: &Name) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self.0, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        String::deserialize(d).map(|s| Name::new(&s))
    }
}

/// One endpoint of one Service port, as an EndpointSlice describes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub port: u16,
    /// `nodeName` of the endpoint, if set. Shared: one node's endpoints share one name (see
    /// [`Name`]).
    pub node: Option<Name>,
    pub zone: Option<Name>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Topology hints (EndpointSlice `hints`), when the slice has any: one allocation, kept
    /// apart so that an endpoint without hints costs one pointer.
    pub hints: Option<Arc<Hints>>,
}

/// Where an endpoint should serve from, as the EndpointSlice controller hints it
/// (`hints.forZones`, `hints.forNodes`). Names are shared like node and zone names.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Hints {
    pub zones: Box<[Name]>,
    pub nodes: Box<[Name]>,
}

impl Endpoint {
    /// The zones this endpoint is hinted for (empty: no zone hint).
    pub fn zone_hints(&self) -> &[Name] {
        self.hints.as_deref().map_or(&[], |h| &h.zones)
    }

    /// The nodes this endpoint is hinted for (empty: no node hint).
    pub fn node_hints(&self) -> &[Name] {
        self.hints.as_deref().map_or(&[], |h| &h.nodes)
    }
}

impl Endpoint {
    /// The endpoint as `ip:port`.
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.addr, self.port)
    }

    /// Whether this endpoint runs on the node called `node_name`.
    pub fn is_local(&self, node_name: &str) -> bool {
        self.node.as_deref() == Some(node_name)
    }
}

/// One Service port's endpoint list from the endpoints its slices give it (each with the port's
/// number): sorted by address and port, and an address listed twice (in two slices, while the
/// EndpointSlice controller moves it) kept once, ready if any of its listings is ready, else as
/// first listed.
pub fn merge_endpoints(mut endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    // Stable: among equal addresses the first listed comes first.
    endpoints.sort_by_key(Endpoint::socket_addr);
    let mut out: Vec<Endpoint> = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        match out.last_mut() {
            Some(last) if last.socket_addr() == e.socket_addr() => {
                if e.ready && !last.ready {
                    *last = e;
                }
            }
            _ => out.push(e),
        }
    }
    out
}

/// The whole desired state the core hands to a dataplane.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceMap {
    pub services: BTreeMap<ServicePortName, ServicePort>,
    pub endpoints: BTreeMap<ServicePortName, Vec<Endpoint>>,
}

/// Values for the backends' unit tests: a plain service port and a ready endpoint, to adjust
/// field by field.
#[cfg(test)]
pub mod fixtures {
    use std::net::{IpAddr, Ipv4Addr};

    use super::{Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};

    /// `default/<name>`, an unnamed TCP port 80 on clusterIP `vip`, round-robin, nothing else.
    pub fn service_port(name: &str, vip: &str) -> ServicePort {
        ServicePort {
            name: ServicePortName::new("default", name, "", Protocol::Tcp),
            cluster_ips: vec![vip.parse().expect("a clusterIP")],
            port: 80,
            protocol: Protocol::Tcp,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            affinity: None,
            external_local: false,
            internal_local: false,
            health_check_node_port: 0,
            algorithm: Algorithm::RoundRobin,
        }
    }

    /// A ready, serving endpoint `addr:8080` on node `node`.
    pub fn endpoint(addr: Ipv4Addr, node: &str) -> Endpoint {
        Endpoint {
            addr: IpAddr::V4(addr),
            port: 8080,
            node: Some(node.into()),
            zone: None,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::fixtures::endpoint;
    use super::*;

    #[test]
    fn an_endpoint_is_48_bytes() {
        // The agent keeps one per endpoint and port (docs/BENCHMARKS.md): node, zone and hints
        // are one pointer each.
        assert_eq!(std::mem::size_of::<Endpoint>(), 48);
        assert_eq!(std::mem::size_of::<Option<Name>>(), 8);
    }

    #[test]
    fn a_service_port_name_is_one_shared_pointer() {
        // Held four or five times per Service port (docs/BENCHMARKS.md).
        assert_eq!(std::mem::size_of::<ServicePortName>(), 8);
        let a = ServicePortName::new("default", "web", "http", Protocol::Tcp);
        let b = a.clone();
        assert!(std::ptr::eq(&*a, &*b), "a clone shares the parts");
        let other = ServicePortName::new("default", "web", "http", Protocol::Tcp);
        assert_eq!(a, other, "names compare by their parts");
        let mut c = a.clone();
        c.protocol = Protocol::Udp;
        assert_eq!(
            a.protocol,
            Protocol::Tcp,
            "writing a shared name copies it first"
        );
        assert!(a < c);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ServicePortName>(&json).unwrap(), c);
    }

    #[test]
    fn merged_endpoints_are_sorted_and_a_twice_listed_address_is_ready_if_either_listing_is() {
        let a = endpoint(Ipv4Addr::new(10, 0, 0, 2), "n1");
        let b_unready = Endpoint {
            ready: false,
            node: Some("first".into()),
            ..endpoint(Ipv4Addr::new(10, 0, 0, 1), "n1")
        };
        let b_ready = Endpoint {
            ready: true,
            node: Some("second".into()),
            ..b_unready.clone()
        };
        let other_port = Endpoint {
            port: 9090,
            ..a.clone()
        };
        let merged = merge_endpoints(vec![
            other_port.clone(),
            a.clone(),
            b_unready.clone(),
            b_ready.clone(),
            a.clone(),
        ]);
        assert_eq!(merged, [b_ready.clone(), a.clone(), other_port]);
        // Neither ready: the first listed stays.
        let b_unready2 = Endpoint {
            ready: false,
            ..b_ready
        };
        assert_eq!(
            merge_endpoints(vec![b_unready.clone(), b_unready2]),
            [b_unready]
        );
    }
}
