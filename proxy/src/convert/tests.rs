//! Conversion and validation cases: what is proxied, what is normalised, what is reported.

use super::*;

fn svc(yaml: &str) -> Service {
    serde_saphyr::from_str(yaml).expect("test fixture parses")
}

const BASE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

#[test]
fn plain_clusterip_service_becomes_one_tcp_port() {
    let c = convert_service(&svc(BASE), Algorithm::RoundRobin);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.ports.len(), 1);
    let p = &c.ports[0];
    assert_eq!(p.name.to_string(), "shop/web:http/TCP");
    assert_eq!(p.cluster_ips, vec!["10.96.0.10".parse::<IpAddr>().unwrap()]);
    assert_eq!((p.port, p.node_port, p.affinity), (80, 0, None));
}

#[test]
fn headless_externalname_and_foreign_proxy_services_are_ignored() {
    for (why, yaml) in [
        ("headless", BASE.replace("10.96.0.10", "None")),
        (
            "ExternalName",
            BASE.replace(
                "clusterIP: 10.96.0.10",
                "type: ExternalName\n  externalName: example.org",
            ),
        ),
        (
            "other proxy",
            BASE.replace(
                "namespace: shop}",
                "namespace: shop, labels: {service.kubernetes.io/service-proxy-name: other}}",
            ),
        ),
        (
            "labelled headless",
            BASE.replace(
                "namespace: shop}",
                "namespace: shop, labels: {service.kubernetes.io/headless: \"\"}}",
            ),
        ),
    ] {
        let c = convert_service(&svc(&yaml), Algorithm::RoundRobin);
        assert!(c.ports.is_empty() && c.errors.is_empty(), "{why}: {:?}", c);
    }
}

#[test]
fn bad_port_is_reported_with_field_and_other_ports_survive() {
    let yaml = BASE.replace(
        "ports: [{name: http, port: 80, targetPort: 8080}]",
        "ports: [{name: http, port: 80}, {name: bad, port: 70000}, {name: q, port: 53, protocol: QUIC}]",
    );
    let c = convert_service(&svc(&yaml), Algorithm::RoundRobin);
    assert_eq!(c.ports.len(), 1);
    let msgs: Vec<String> = c.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        msgs[0],
        "Service shop/web: spec.ports[1].port: 70000 is outside 1-65535"
    );
    assert_eq!(
        msgs[1],
        "Service shop/web: spec.ports[2].protocol: \"QUIC\" is not TCP, UDP or SCTP"
    );
}

#[test]
fn leading_zero_ipv4_is_normalised_as_decimal() {
    assert_eq!(
        parse_ip_sloppy("010.096.000.010"),
        Some("10.96.0.10".parse().unwrap())
    );
    assert_eq!(parse_ip_sloppy("10.96.0.256"), None);
    assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
    let c = convert_service(
        &svc(&BASE.replace("10.96.0.10", "010.096.000.010")),
        Algorithm::RoundRobin,
    );
    assert_eq!(c.ports[0].cluster_ips[0].to_string(), "10.96.0.10");
}

#[test]
fn nodeport_lb_affinity_policies_and_annotation() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default, annotations: {kpr.io/balance: least-conn}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalIPs: [192.0.2.50]
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [198.51.100.0/24]
  sessionAffinity: ClientIP
  ports: [{port: 443, nodePort: 30443, protocol: TCP}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.7}, {ip: 203.0.113.8, ipMode: Proxy}]
"#;
    let c = convert_service(&svc(yaml), Algorithm::RoundRobin);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let p = &c.ports[0];
    assert_eq!(p.node_port, 30443);
    assert_eq!(
        p.load_balancer_ips,
        vec!["203.0.113.7".parse::<IpAddr>().unwrap()],
        "ipMode Proxy is not programmed"
    );
    assert_eq!(p.external_ips.len(), 1);
    assert_eq!(p.source_ranges[0].to_string(), "198.51.100.0/24");
    assert_eq!(p.affinity, Some(DEFAULT_AFFINITY_TIMEOUT));
    assert!(p.external_local && p.internal_local);
    assert_eq!(p.health_check_node_port, 32000);
    assert_eq!(p.algorithm, Algorithm::LeastConn);
}

#[test]
fn unknown_algorithm_annotation_falls_back_and_says_so() {
    let yaml = BASE.replace(
        "namespace: shop}",
        "namespace: shop, annotations: {kpr.io/balance: fastest}}",
    );
    let c = convert_service(&svc(&yaml), Algorithm::LeastConn);
    assert_eq!(c.ports[0].algorithm, Algorithm::LeastConn);
    assert!(c.errors[0]
        .to_string()
        .contains("metadata.annotations[kpr.io/balance]"));
}

#[test]
fn slice_conditions_default_like_kubernetes() {
    let yaml = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  nodeName: node-a
- addresses: [10.244.1.3]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [not-an-ip]
- addresses: [fd00::1]
"#;
    let slice: EndpointSlice = serde_saphyr::from_str(yaml).unwrap();
    let (info, errs) = convert_slice(&slice);
    let info = info.unwrap();
    assert_eq!(&*info.service, "web");
    assert_eq!(&*info.ports, [(Arc::from("http"), Protocol::Tcp, 8080)]);
    assert_eq!(info.endpoints.len(), 2);
    assert!(info.endpoints[0].ready && info.endpoints[0].serving && !info.endpoints[0].terminating);
    assert!(!info.endpoints[1].ready && info.endpoints[1].serving && info.endpoints[1].terminating);
    let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(msgs[0].starts_with("EndpointSlice shop/web-abc: endpoints[2].addresses[0]"));
    assert!(msgs[1].contains("does not match addressType IPv4"));
}

#[test]
fn a_services_key_and_its_port_names_share_their_strings() {
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.7\n  ports: [{name: http, port: 80}, {name: https, port: 443}]\n";
    let svc: Service = serde_saphyr::from_str(yaml).unwrap();
    let entry = ServiceEntry::new(&svc, Algorithm::RoundRobin);
    assert_eq!(entry.ports.len(), 2);
    for p in &*entry.ports {
        assert!(std::sync::Arc::ptr_eq(&p.name.namespace, &entry.key.0));
        assert!(std::sync::Arc::ptr_eq(&p.name.name, &entry.key.1));
    }
    // Namespaces and node names are pooled: another object of the namespace gets the same one.
    let other = ServiceEntry::new(
        &serde_saphyr::from_str(&yaml.replace("name: web", "name: api")).unwrap(),
        Algorithm::RoundRobin,
    );
    assert!(std::sync::Arc::ptr_eq(&other.key.0, &entry.key.0));
}

#[test]
fn the_tracker_keeps_an_entrys_own_ports() {
    // Applying an entry moves its shared ports: no copy per port.
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.7\n  ports: [{name: http, port: 80}]\n";
    let entry = ServiceEntry::new(
        &serde_saphyr::from_str(yaml).unwrap(),
        Algorithm::RoundRobin,
    );
    let port = entry.ports[0].clone();
    let mut t = crate::tracker::Tracker::new(
        Algorithm::RoundRobin,
        crate::selection::NodeContext::default(),
    );
    t.apply_service_entry(entry);
    t.take_changes();
    let (_, state) = t.state().iter().next().expect("the port is in the state");
    assert!(std::sync::Arc::ptr_eq(&state.service, &port));
}

#[test]
fn topology_hints_are_kept_and_shared() {
    let yaml = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  zone: z1
  hints: {forZones: [{name: z1}], forNodes: [{name: node-a}]}
- addresses: [10.244.1.3]
  hints: {}
- addresses: [10.244.1.4]
"#;
    let slice: EndpointSlice = serde_saphyr::from_str(yaml).unwrap();
    let (info, errs) = convert_slice(&slice);
    assert!(errs.is_empty(), "{errs:?}");
    let eps = info.unwrap().endpoints;
    assert_eq!(eps[0].zone_hints(), [Name::from("z1")]);
    assert_eq!(eps[0].node_hints(), [Name::from("node-a")]);
    assert!(
        Name::ptr_eq(&eps[0].zone_hints()[0], eps[0].zone.as_ref().unwrap()),
        "the hint and the zone share one name"
    );
    assert!(eps[1].hints.is_none(), "empty hints are no hints");
    assert!(eps[2].hints.is_none());
}
