//! Builders for the manifests tests feed the agent's file source: v1 Services and
//! discovery.k8s.io/v1 EndpointSlices, rendered as (multi-document) YAML.
//!
//! They read like the scenario: `Service::new("web").cluster_ip("10.96.0.10").tcp(80, 8080)` and
//! `EndpointSlice::for_service(&svc).ready(ip)`. Only fields a test sets are written.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// Anything that renders as one Kubernetes object.
pub trait Manifest {
    fn to_value(&self) -> Value;
}

impl Manifest for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}

/// Renders objects as one multi-document YAML text.
pub fn yaml(objects: &[&dyn Manifest]) -> String {
    objects
        .iter()
        .map(|o| serde_saphyr::to_string(&o.to_value()).expect("JSON values always render as YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One port of a Service.
#[derive(Debug, Clone)]
pub struct Port {
    pub name: Option<String>,
    pub port: u16,
    pub target_port: u16,
    pub protocol: String,
    pub node_port: Option<u16>,
}

/// A v1 Service.
#[derive(Debug, Clone)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub type_: String,
    pub cluster_ip: Option<String>,
    /// All clusterIPs when dual-stack (the first equals `cluster_ip`).
    pub cluster_ips: Vec<String>,
    pub ports: Vec<Port>,
    pub external_ips: Vec<String>,
    pub lb_ingress: Vec<String>,
    pub lb_source_ranges: Vec<String>,
    pub external_traffic_policy: Option<String>,
    pub internal_traffic_policy: Option<String>,
    pub affinity_timeout: Option<u32>,
    pub health_check_node_port: Option<u16>,
    /// `type: ExternalName` with this name.
    pub external_name: Option<String>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

impl Service {
    /// A ClusterIP Service in namespace `default` without ports yet.
    pub fn new(name: &str) -> Service {
        Service {
            namespace: "default".into(),
            name: name.into(),
            type_: "ClusterIP".into(),
            cluster_ip: None,
            cluster_ips: Vec::new(),
            ports: Vec::new(),
            external_ips: Vec::new(),
            lb_ingress: Vec::new(),
            lb_source_ranges: Vec::new(),
            external_traffic_policy: None,
            internal_traffic_policy: None,
            affinity_timeout: None,
            health_check_node_port: None,
            external_name: None,
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
        }
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = ns.into();
        self
    }

    pub fn cluster_ip(mut self, ip: &str) -> Self {
        self.cluster_ip = Some(ip.into());
        self.cluster_ips = vec![ip.into()];
        self
    }

    /// A dual-stack Service (`ipFamilyPolicy: RequireDualStack`) with these clusterIPs, primary
    /// family first.
    pub fn cluster_ips(mut self, ips: &[&str]) -> Self {
        self.cluster_ip = ips.first().map(|ip| ip.to_string());
        self.cluster_ips = ips.iter().map(|ip| ip.to_string()).collect();
        self
    }

    /// Adds an unnamed port; [`Service::named`] names it.
    pub fn port(mut self, port: u16, target_port: u16, protocol: &str) -> Self {
        self.ports.push(Port {
            name: None,
            port,
            target_port,
            protocol: protocol.into(),
            node_port: None,
        });
        self
    }

    pub fn tcp(self, port: u16, target_port: u16) -> Self {
        self.port(port, target_port, "TCP")
    }

    pub fn udp(self, port: u16, target_port: u16) -> Self {
        self.port(port, target_port, "UDP")
    }

    /// Names the last port added.
    pub fn named(mut self, name: &str) -> Self {
        self.last_port().name = Some(name.into());
        self
    }

    /// Makes it a NodePort Service (if it is ClusterIP) and sets the last port's node port.
    pub fn node_port(mut self, node_port: u16) -> Self {
        if self.type_ == "ClusterIP" {
            self.type_ = "NodePort".into();
        }
        self.last_port().node_port = Some(node_port);
        self
    }

    /// Makes it a LoadBalancer Service with this ingress IP in its status.
    pub fn load_balancer(mut self, ingress_ip: &str) -> Self {
        self.type_ = "LoadBalancer".into();
        self.lb_ingress.push(ingress_ip.into());
        self
    }

    pub fn lb_source_range(mut self, cidr: &str) -> Self {
        self.lb_source_ranges.push(cidr.into());
        self
    }

    pub fn external_ip(mut self, ip: &str) -> Self {
        self.external_ips.push(ip.into());
        self
    }

    pub fn external_traffic_local(mut self) -> Self {
        self.external_traffic_policy = Some("Local".into());
        self
    }

    pub fn internal_traffic_local(mut self) -> Self {
        self.internal_traffic_policy = Some("Local".into());
        self
    }

    /// `sessionAffinity: ClientIP` with this timeout.
    pub fn affinity(mut self, timeout_seconds: u32) -> Self {
        self.affinity_timeout = Some(timeout_seconds);
        self
    }

    /// An ExternalName Service (a DNS alias; no proxy programs it).
    pub fn external_name(mut self, name: &str) -> Self {
        self.type_ = "ExternalName".into();
        self.external_name = Some(name.into());
        self
    }

    pub fn health_check_node_port(mut self, port: u16) -> Self {
        self.health_check_node_port = Some(port);
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The `kpr.io/balance` annotation (`round-robin` or `least-conn`).
    pub fn balance(self, algorithm: &str) -> Self {
        self.annotation("kpr.io/balance", algorithm)
    }

    fn last_port(&mut self) -> &mut Port {
        self.ports
            .last_mut()
            .expect("add a port first (tcp/udp/port)")
    }

    /// `ns/name:port/PROTO` (or `ns/name/PROTO` for an unnamed port): the name `/state` uses.
    pub fn port_name(&self, index: usize) -> String {
        let p = &self.ports[index];
        match &p.name {
            Some(n) => format!("{}/{}:{}/{}", self.namespace, self.name, n, p.protocol),
            None => format!("{}/{}/{}", self.namespace, self.name, p.protocol),
        }
    }

    fn spec(&self) -> Value {
        let mut spec = Map::new();
        spec.insert("type".into(), json!(self.type_));
        if let Some(ip) = &self.cluster_ip {
            spec.insert("clusterIP".into(), json!(ip));
            spec.insert("clusterIPs".into(), json!(self.cluster_ips));
            let families: Vec<&str> = self
                .cluster_ips
                .iter()
                .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
                .collect();
            let policy = if families.len() > 1 {
                "RequireDualStack"
            } else {
                "SingleStack"
            };
            spec.insert("ipFamilies".into(), json!(families));
            spec.insert("ipFamilyPolicy".into(), json!(policy));
        }
        let ports: Vec<Value> = self.ports.iter().map(port_value).collect();
        spec.insert("ports".into(), Value::Array(ports));
        let optional = [
            (
                "externalIPs",
                (!self.external_ips.is_empty()).then(|| json!(self.external_ips)),
            ),
            (
                "loadBalancerSourceRanges",
                (!self.lb_source_ranges.is_empty()).then(|| json!(self.lb_source_ranges)),
            ),
            (
                "externalTrafficPolicy",
                self.external_traffic_policy.as_ref().map(|p| json!(p)),
            ),
            (
                "internalTrafficPolicy",
                self.internal_traffic_policy.as_ref().map(|p| json!(p)),
            ),
            (
                "healthCheckNodePort",
                self.health_check_node_port.map(|p| json!(p)),
            ),
            (
                "externalName",
                self.external_name.as_ref().map(|n| json!(n)),
            ),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                spec.insert(key.into(), v);
            }
        }
        if let Some(t) = self.affinity_timeout {
            spec.insert("sessionAffinity".into(), json!("ClientIP"));
            spec.insert(
                "sessionAffinityConfig".into(),
                json!({"clientIP": {"timeoutSeconds": t}}),
            );
        }
        Value::Object(spec)
    }
}

fn port_value(p: &Port) -> Value {
    let mut v = json!({"port": p.port, "targetPort": p.target_port, "protocol": p.protocol});
    if let Some(n) = &p.name {
        v["name"] = json!(n);
    }
    if let Some(np) = p.node_port {
        v["nodePort"] = json!(np);
    }
    v
}

fn metadata(
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Value {
    let mut m = json!({"name": name, "namespace": namespace});
    if !labels.is_empty() {
        m["labels"] = json!(labels);
    }
    if !annotations.is_empty() {
        m["annotations"] = json!(annotations);
    }
    m
}

impl Manifest for Service {
    fn to_value(&self) -> Value {
        let mut v = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(&self.namespace, &self.name, &self.labels, &self.annotations),
            "spec": self.spec(),
        });
        if !self.lb_ingress.is_empty() {
            let ingress: Vec<Value> = self.lb_ingress.iter().map(|ip| json!({"ip": ip})).collect();
            v["status"] = json!({"loadBalancer": {"ingress": ingress}});
        }
        v
    }
}

/// One endpoint of an EndpointSlice.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub ip: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones`, as the EndpointSlice controller writes them for
    /// `trafficDistribution: PreferClose`.
    pub hint_zones: Vec<String>,
}

impl Endpoint {
    /// A ready, serving endpoint on the test node.
    pub fn ready(ip: impl ToString) -> Endpoint {
        Endpoint {
            ip: ip.to_string(),
            ready: true,
            serving: true,
            terminating: false,
            node_name: Some(crate::cluster::NODE_NAME.into()),
            zone: None,
            hint_zones: Vec::new(),
        }
    }

    /// Not ready (and not serving).
    pub fn not_ready(ip: impl ToString) -> Endpoint {
        Endpoint {
            ready: false,
            serving: false,
            ..Endpoint::ready(ip)
        }
    }

    /// Terminating but still serving.
    pub fn terminating(ip: impl ToString) -> Endpoint {
        Endpoint {
            ready: false,
            serving: true,
            terminating: true,
            ..Endpoint::ready(ip)
        }
    }

    pub fn on_node(mut self, node: &str) -> Self {
        self.node_name = Some(node.into());
        self
    }

    pub fn zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Adds `zone` to the endpoint's `hints.forZones`.
    pub fn hint_zone(mut self, zone: &str) -> Self {
        self.hint_zones.push(zone.into());
        self
    }

    fn to_value(&self) -> Value {
        let mut v = json!({
            "addresses": [self.ip],
            "conditions": {"ready": self.ready, "serving": self.serving, "terminating": self.terminating},
        });
        if let Some(n) = &self.node_name {
            v["nodeName"] = json!(n);
        }
        if let Some(z) = &self.zone {
            v["zone"] = json!(z);
        }
        if !self.hint_zones.is_empty() {
            let zones: Vec<Value> = self.hint_zones.iter().map(|z| json!({"name": z})).collect();
            v["hints"] = json!({"forZones": zones});
        }
        v
    }
}

/// A discovery.k8s.io/v1 EndpointSlice.
#[derive(Debug, Clone)]
pub struct EndpointSlice {
    pub namespace: String,
    pub name: String,
    pub service: String,
    pub address_type: String,
    /// (name, port, protocol)
    pub ports: Vec<(Option<String>, u16, String)>,
    pub endpoints: Vec<Endpoint>,
}

impl EndpointSlice {
    /// An empty slice `<svc>-1` for the Service, with its ports' names, target ports and protocols.
    pub fn for_service(svc: &Service) -> EndpointSlice {
        EndpointSlice {
            namespace: svc.namespace.clone(),
            name: format!("{}-1", svc.name),
            service: svc.name.clone(),
            address_type: "IPv4".into(),
            ports: svc
                .ports
                .iter()
                .map(|p| (p.name.clone(), p.target_port, p.protocol.clone()))
                .collect(),
            endpoints: Vec::new(),
        }
    }

    /// An IPv6 slice (`addressType: IPv6`, named `<svc>-v6`).
    pub fn ipv6(mut self) -> Self {
        self.address_type = "IPv6".into();
        self.name = format!("{}-v6", self.service);
        self
    }

    /// Renames the slice (for a second slice of one Service).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    pub fn endpoint(mut self, e: Endpoint) -> Self {
        self.endpoints.push(e);
        self
    }

    /// Adds a ready endpoint on the test node.
    pub fn ready(self, ip: impl ToString) -> Self {
        self.endpoint(Endpoint::ready(ip))
    }

    /// Adds ready endpoints on the test node.
    pub fn ready_all<I: ToString>(self, ips: impl IntoIterator<Item = I>) -> Self {
        ips.into_iter().fold(self, |s, ip| s.ready(ip))
    }
}

impl Manifest for EndpointSlice {
    fn to_value(&self) -> Value {
        let labels = BTreeMap::from([(
            "kubernetes.io/service-name".to_string(),
            self.service.clone(),
        )]);
        let ports: Vec<Value> = self
            .ports
            .iter()
            .map(|(name, port, proto)| {
                let mut v = json!({"port": port, "protocol": proto});
                if let Some(n) = name {
                    v["name"] = json!(n);
                }
                v
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": metadata(&self.namespace, &self.name, &labels, &BTreeMap::new()),
            "addressType": self.address_type,
            "ports": ports,
            "endpoints": self.endpoints.iter().map(Endpoint::to_value).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_slice_render_the_fields_a_scenario_sets() {
        let svc = Service::new("web")
            .cluster_ip("10.96.0.10")
            .tcp(80, 8080)
            .named("http")
            .node_port(30080)
            .external_ip("203.0.113.5")
            .affinity(30)
            .balance("least-conn");
        let slice = EndpointSlice::for_service(&svc)
            .ready("10.244.1.2")
            .endpoint(Endpoint::terminating("10.244.2.2"));
        let text = yaml(&[&svc, &slice]);
        let docs: Vec<Value> = text
            .split("---\n")
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 2);
        let s = &docs[0];
        assert_eq!(s["kind"], "Service");
        assert_eq!(s["spec"]["type"], "NodePort");
        assert_eq!(s["spec"]["ports"][0]["nodePort"], 30080);
        assert_eq!(s["spec"]["ports"][0]["name"], "http");
        assert_eq!(
            s["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            30
        );
        assert_eq!(s["metadata"]["annotations"]["kpr.io/balance"], "least-conn");
        let e = &docs[1];
        assert_eq!(e["metadata"]["labels"]["kubernetes.io/service-name"], "web");
        assert_eq!(e["ports"][0]["port"], 8080);
        assert_eq!(e["ports"][0]["name"], "http");
        assert_eq!(e["endpoints"][1]["conditions"]["terminating"], true);
        assert_eq!(e["endpoints"][1]["conditions"]["ready"], false);
        assert_eq!(svc.port_name(0), "default/web:http/TCP");
    }

    #[test]
    fn dual_stack_service_and_ipv6_slice() {
        let svc = Service::new("ds")
            .cluster_ips(&["10.96.0.60", "fd00:10:96::60"])
            .tcp(80, 8080);
        let v = svc.to_value();
        assert_eq!(v["spec"]["clusterIP"], "10.96.0.60");
        assert_eq!(v["spec"]["clusterIPs"][1], "fd00:10:96::60");
        assert_eq!(v["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        assert_eq!(v["spec"]["ipFamilyPolicy"], "RequireDualStack");
        let slice = EndpointSlice::for_service(&svc)
            .ipv6()
            .ready("fd00:10:244:1::2")
            .to_value();
        assert_eq!(slice["addressType"], "IPv6");
        assert_eq!(slice["metadata"]["name"], "ds-v6");
    }

    #[test]
    fn load_balancer_ingress_goes_to_status() {
        let svc = Service::new("lb")
            .cluster_ip("10.96.0.20")
            .tcp(80, 8080)
            .load_balancer("198.51.100.7");
        let v = svc.to_value();
        assert_eq!(v["spec"]["type"], "LoadBalancer");
        assert_eq!(
            v["status"]["loadBalancer"]["ingress"][0]["ip"],
            "198.51.100.7"
        );
    }
}
