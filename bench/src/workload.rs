//! The benchmark's workload: N Services with M endpoints each, as the in-process [`ProxyState`]
//! the dataplanes compile and as the YAML manifests the `proxy` agent's file source reads.
//!
//! Owns the address plan: Service `i` is `bench/svc-<i, zero padded>` port `http` 80/TCP on
//! clusterIP `10.96.0.0 + 10 + i` (past 10.96.255.255 this continues into 10.97.0.0/16 and on,
//! each /16 used added to the service CIDRs, see [`service_cidrs`]); the last [`NODE_PORTS`] Services are also NodePort
//! (`30000 + ...`: the nodePort range cannot hold 20,000 ports); endpoint `j` of Service `i` is pod
//! `(i + j) % pods` on port 8080. Names sort in index order, so Service `N - 1` is last in every
//! backend's rule order. An IPv6 workload ([`IpFamily::V6`]) has the same Services IPv6-only:
//! clusterIP `fd00:10:96:: + 10 + i` (one /112 per 65,536, see [`service_cidrs6`]), endpoints on
//! the pods' IPv6 addresses.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpr_tests::cluster::{
    CLUSTER_CIDR, CLUSTER_CIDR6, ECHO_PORT, NODE_IP, NODE_IP6, NODE_NAME, SERVICE_CIDR,
};
use proxy::dataplane::BackendConfig;
use proxy::model::{Algorithm, Endpoint, IpFamily, Protocol, ServicePort, ServicePortName};
use proxy::selection::NodeContext;
use proxy::state::{ChangeSet, ProxyState};

/// How many of the last Services also get a node port.
pub const NODE_PORTS: usize = 2_500;
/// The Service port every Service exposes.
pub const SERVICE_PORT: u16 = 80;
/// Most Services the address plan holds (names are zero padded to 6 digits, so they sort in index
/// order up to here; clusterIPs stay inside 10.96.0.0/12).
pub const MAX_SERVICES: usize = 200_000;

/// The service CIDRs of a workload of `services` Services: 10.96.0.0/16 (the harness's
/// [`SERVICE_CIDR`]), plus 10.97.0.0/16, ... when the clusterIPs go past it.
pub fn service_cidrs(services: usize) -> Vec<String> {
    let last = Workload::cluster_ip(services.max(1) - 1).octets()[1];
    std::iter::once(SERVICE_CIDR.to_string())
        .chain((97..=last).map(|b| format!("10.{b}.0.0/16")))
        .collect()
}

/// The IPv6 service CIDRs of a workload of `services` Services: a /112 per 65,536 clusterIPs
/// from fd00:10:96::/112 (the harness's IPv6 service range) on.
pub fn service_cidrs6(services: usize) -> Vec<String> {
    let blocks = (services + 10).div_ceil(65_536);
    (0..blocks)
        .map(|b| {
            if b == 0 {
                "fd00:10:96::/112".to_string()
            } else {
                format!("fd00:10:96::{b:x}:0/112")
            }
        })
        .collect()
}

/// The service CIDRs of a workload of `services` Services of `family`.
pub fn service_cidrs_of(services: usize, family: IpFamily) -> Vec<String> {
    match family {
        IpFamily::V4 => service_cidrs(services),
        IpFamily::V6 => service_cidrs6(services),
    }
}

/// N Services over a set of pod addresses.
#[derive(Debug, Clone)]
pub struct Workload {
    pub services: usize,
    pub endpoints: usize,
    pub pods: Vec<Ipv4Addr>,
    /// The pods' IPv6 addresses (an IPv6 workload's endpoints).
    pub pods6: Vec<Ipv6Addr>,
    /// IPv4: the address plan above; IPv6: the same Services IPv6-only.
    pub family: IpFamily,
}

impl Workload {
    /// An IPv4 workload.
    pub fn v4(services: usize, endpoints: usize, pods: Vec<Ipv4Addr>) -> Workload {
        Workload {
            services,
            endpoints,
            pods,
            pods6: Vec::new(),
            family: IpFamily::V4,
        }
    }

    /// The clusterIP of Service `i`.
    pub fn cluster_ip(i: usize) -> Ipv4Addr {
        let x = u32::try_from(i + 10).expect("fewer than 2^32 Services");
        assert!(
            x < MAX_SERVICES as u32 + 10,
            "Service {i} is past {MAX_SERVICES}"
        );
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + x)
    }

    /// The IPv6 clusterIP of Service `i` (of an IPv6 workload).
    pub fn cluster_ip6(i: usize) -> Ipv6Addr {
        let x = u128::try_from(i + 10).expect("fits");
        Ipv6Addr::from(u128::from("fd00:10:96::".parse::<Ipv6Addr>().expect("constant")) + x)
    }

    /// Service `i`'s clusterIP in this workload's family.
    pub fn service_ip(&self, i: usize) -> IpAddr {
        match self.family {
            IpFamily::V4 => Self::cluster_ip(i).into(),
            IpFamily::V6 => Self::cluster_ip6(i).into(),
        }
    }

    /// The addresses Service `i`'s endpoints are on, in this workload's family.
    pub fn endpoint_addrs(&self, i: usize) -> Vec<IpAddr> {
        match self.family {
            IpFamily::V4 => self.endpoint_ips(i).into_iter().map(IpAddr::V4).collect(),
            IpFamily::V6 => (0..self.endpoints)
                .map(|j| IpAddr::V6(self.pods6[(i + j) % self.pods6.len()]))
                .collect(),
        }
    }

    /// The node port of Service `i`, if it has one.
    pub fn node_port(&self, i: usize) -> Option<u16> {
        let first = self.services.saturating_sub(NODE_PORTS);
        (i >= first).then(|| 30_000 + u16::try_from(i - first).expect("< 2,500"))
    }

    pub fn name(i: usize) -> String {
        format!("svc-{i:06}")
    }

    pub fn port_name(i: usize) -> ServicePortName {
        ServicePortName::new("bench", Self::name(i), "http", Protocol::Tcp)
    }

    /// The pod addresses Service `i`'s endpoints are on.
    pub fn endpoint_ips(&self, i: usize) -> Vec<Ipv4Addr> {
        (0..self.endpoints)
            .map(|j| self.pods[(i + j) % self.pods.len()])
            .collect()
    }

    fn service_port(&self, i: usize, algorithm: Algorithm) -> ServicePort {
        ServicePort {
            name: Self::port_name(i),
            cluster_ips: vec![self.service_ip(i)],
            port: SERVICE_PORT,
            protocol: Protocol::Tcp,
            node_port: self.node_port(i).unwrap_or(0),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity: None,
            external_local: false,
            internal_local: false,
            health_check_node_port: 0,
            algorithm,
        }
    }

    fn endpoint(ip: IpAddr, ready: bool) -> Endpoint {
        Endpoint {
            addr: ip,
            port: ECHO_PORT,
            node: Some(NODE_NAME.into()),
            zone: None,
            ready,
            serving: ready,
            terminating: false,
            hints: None,
        }
    }

    /// The whole state: every Service with all its endpoints ready.
    pub fn state(&self) -> ProxyState {
        let mut state = ProxyState::new(node_context());
        for i in 0..self.services {
            let eps: Vec<_> = self
                .endpoint_addrs(i)
                .into_iter()
                .map(|ip| Self::endpoint(ip, true))
                .collect();
            state.set_port(self.service_port(i, Algorithm::RoundRobin), eps);
        }
        state
    }

    /// Changes Service `i` in `state`: its first endpoint becomes not ready (`ready == false`) or
    /// ready again; returns the ChangeSet a tracker would produce.
    pub fn flip_endpoint(&self, state: &mut ProxyState, i: usize, ready: bool) -> ChangeSet {
        let name = Self::port_name(i);
        let mut eps = state
            .get(&name)
            .map(|p| p.endpoints.to_vec())
            .unwrap_or_default();
        let removed: Vec<Endpoint> = if ready { Vec::new() } else { eps[..1].to_vec() };
        eps[0] = Self::endpoint(self.endpoint_addrs(i)[0], ready);
        let svc = state
            .get(&name)
            .expect("a Service of the workload")
            .service
            .clone();
        state.set_port(svc, eps);
        ChangeSet {
            changed: [name.clone()].into(),
            removed_endpoints: if removed.is_empty() {
                BTreeMap::new()
            } else {
                [(name, removed)].into()
            },
            ..ChangeSet::default()
        }
    }

    /// Sets Service `i`'s algorithm; returns the ChangeSet.
    pub fn set_algorithm(
        &self,
        state: &mut ProxyState,
        i: usize,
        algorithm: Algorithm,
    ) -> ChangeSet {
        let name = Self::port_name(i);
        let eps = state
            .get(&name)
            .expect("a Service of the workload")
            .endpoints
            .to_vec();
        state.set_port(self.service_port(i, algorithm), eps);
        ChangeSet {
            changed: [name].into(),
            ..ChangeSet::default()
        }
    }

    /// The Services and EndpointSlices as manifest files for `proxy run --source file:DIR`
    /// (files of at most 1,000 Services each).
    pub fn manifests(&self) -> Vec<(String, String)> {
        (0..self.services)
            .step_by(1_000)
            .map(|start| {
                let end = (start + 1_000).min(self.services);
                let mut text = String::new();
                for i in start..end {
                    text.push_str(&self.manifest(i));
                }
                (format!("bench-{start:06}.yaml"), text)
            })
            .collect()
    }

    fn manifest(&self, i: usize) -> String {
        let ip = self.service_ip(i).to_string();
        let svc = kpr_tests::Service::new(&Self::name(i)).namespace("bench");
        let svc = match self.family {
            IpFamily::V4 => svc.cluster_ip(&ip),
            IpFamily::V6 => svc.cluster_ips(&[&ip]),
        };
        let mut svc = svc.tcp(SERVICE_PORT, ECHO_PORT).named("http");
        if let Some(np) = self.node_port(i) {
            svc = svc.node_port(np);
        }
        let slice = kpr_tests::EndpointSlice::for_service(&svc);
        let slice = match self.family {
            IpFamily::V4 => slice.ready_all(self.endpoint_ips(i)),
            IpFamily::V6 => {
                let eps = (0..self.endpoints).map(|j| self.pods6[(i + j) % self.pods6.len()]);
                slice.ipv6().ready_all(eps)
            }
        };
        format!("---\n{}", kpr_tests::yaml(&[&svc, &slice]))
    }
}

/// The node as the harness's agent flags describe it (a dual-stack site's node: the IPv6
/// address and pod range are unused by an IPv4 workload).
pub fn node_context() -> NodeContext {
    NodeContext {
        node_name: NODE_NAME.into(),
        cluster_cidrs: vec![
            CLUSTER_CIDR.parse().expect("constant"),
            CLUSTER_CIDR6.parse().expect("constant"),
        ],
        node_ips: vec![IpAddr::V4(NODE_IP), IpAddr::V6(NODE_IP6)],
        masquerade_all: false,
        zone: None,
        maglev_table_size: Default::default(),
    }
}

/// The backend configuration the harness's agent would get for `services` Services (plus the
/// eBPF cgroup, if any).
pub fn backend_config(
    services: usize,
    family: IpFamily,
    cgroup: Option<&kpr_tests::Cgroup>,
    bpffs: &std::path::Path,
) -> BackendConfig {
    BackendConfig {
        node: node_context(),
        service_cidrs: service_cidrs_of(services, family)
            .iter()
            .map(|c| c.parse().expect("generated CIDR"))
            .collect(),
        cgroup_path: cgroup.map(|c| c.path().to_path_buf()),
        bpffs_path: bpffs.to_path_buf(),
        ..BackendConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(n: usize) -> Workload {
        Workload {
            services: n,
            endpoints: 4,
            pods: (1..=4).map(|i| Ipv4Addr::new(10, 244, i, 2)).collect(),
            pods6: Vec::new(),
            family: IpFamily::V4,
        }
    }

    #[test]
    fn an_ipv6_workload_is_the_same_services_in_ipv6() {
        let w = Workload {
            family: IpFamily::V6,
            pods6: (1..=4)
                .map(|i| format!("fd00:10:244:{i}::2").parse().unwrap())
                .collect(),
            ..workload(70_000)
        };
        assert_eq!(w.service_ip(0), "fd00:10:96::a".parse::<IpAddr>().unwrap());
        assert_eq!(
            w.service_ip(69_999),
            "fd00:10:96::1:1179".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            service_cidrs6(70_000),
            vec!["fd00:10:96::/112", "fd00:10:96::1:0/112"]
        );
        for cidr in service_cidrs6(70_000) {
            let _: std::net::Ipv6Addr = cidr.split('/').next().unwrap().parse().unwrap();
        }
        let state = w.state();
        let eps = &state.get(&Workload::port_name(5)).unwrap().endpoints;
        assert!(eps.iter().all(|e| e.addr.is_ipv6()), "{eps:?}");
        let text = Workload { services: 3, ..w }.manifests()[0].1.clone();
        assert!(text.contains("addressType: IPv6"), "{text}");
        assert!(text.contains("fd00:10:96::c"), "{text}");
    }

    #[test]
    fn addresses_and_node_ports_follow_the_plan() {
        let w = workload(20_000);
        assert_eq!(Workload::cluster_ip(0), Ipv4Addr::new(10, 96, 0, 10));
        assert_eq!(Workload::cluster_ip(19_999), Ipv4Addr::new(10, 96, 78, 41));
        assert_eq!(w.node_port(17_499), None);
        assert_eq!(w.node_port(17_500), Some(30_000));
        assert_eq!(w.node_port(19_999), Some(32_499));
        assert!(Workload::name(9) < Workload::name(10_000));
        assert!(Workload::name(99_999) < Workload::name(100_000));
    }

    #[test]
    fn service_cidrs_cover_every_cluster_ip() {
        assert_eq!(service_cidrs(20_000), vec![SERVICE_CIDR.to_string()]);
        assert_eq!(
            Workload::cluster_ip(99_999),
            Ipv4Addr::new(10, 97, 134, 169)
        );
        assert_eq!(
            service_cidrs(100_000),
            vec![SERVICE_CIDR.to_string(), "10.97.0.0/16".to_string()]
        );
        assert_eq!(service_cidrs(200_000).len(), 4);
    }

    #[test]
    fn flipping_an_endpoint_changes_only_that_service() {
        let w = workload(10);
        let mut state = w.state();
        assert_eq!(state.len(), 10);
        let changes = w.flip_endpoint(&mut state, 3, false);
        let name = Workload::port_name(3);
        assert_eq!(changes.changed.len(), 1);
        assert_eq!(state.get(&name).unwrap().selected.cluster.len(), 3);
        assert_eq!(changes.removed_endpoints[&name].len(), 1);
        w.flip_endpoint(&mut state, 3, true);
        assert_eq!(state.get(&name).unwrap().selected.cluster.len(), 4);
    }

    #[test]
    fn manifests_hold_every_service() {
        let w = workload(1_500);
        let files = w.manifests();
        assert_eq!(files.len(), 2);
        let text: String = files.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(text.matches("kind: Service\n").count(), 1_500);
        assert!(text.contains("nodePort: 30000"));
    }
}
