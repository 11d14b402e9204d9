//! Shared rig for the rule-backend kernel tests (`rules_*.rs`): a namespace cluster from
//! `kpr-tests`, a [`Dataplane`] driven from a thread inside the node namespace, and builders for
//! Services and endpoints. Scenarios take a [`Rig`] and work with any backend, so the same table
//! of scenarios runs against nftables and iptables (and, later, the conformance suite).
#![allow(
    dead_code,
    reason = "each test crate uses a different subset of the rig"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use kpr_tests::cluster::{CLUSTER_CIDR, ECHO_PORT, NODE_IP, NODE_NAME, SERVICE_CIDR};
use kpr_tests::{Cluster, ClusterSpec};
use proxy::dataplane::{BackendConfig, Dataplane};
use proxy::error::DataplaneError;
use proxy::model::{Algorithm, Endpoint, Protocol, ServicePort, ServicePortName};
use proxy::selection::NodeContext;
use proxy::state::{ChangeSet, ProxyState, SyncStats};

/// Makes the backend under test.
pub type MakeBackend = fn(&BackendConfig) -> Result<Box<dyn Dataplane>, DataplaneError>;

/// A test cluster with a backend programming its node namespace.
pub struct Rig {
    /// Declared first: the backend (and its helper processes) go before the namespaces.
    pub dp: Box<dyn Dataplane>,
    pub state: ProxyState,
    pub cfg: BackendConfig,
    pub cluster: Cluster,
}

pub const TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client waits before a dropped packet counts as dropped.
pub const DROP_WAIT: Duration = Duration::from_millis(700);

/// The node context every rig uses (matches `kpr_tests::cluster`).
pub fn node_context() -> NodeContext {
    NodeContext {
        node_name: NODE_NAME.into(),
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        node_ips: vec![IpAddr::V4(NODE_IP)],
        masquerade_all: false,
        zone: None,
        maglev_table_size: Default::default(),
    }
}

pub fn backend_config() -> BackendConfig {
    BackendConfig {
        node: node_context(),
        service_cidrs: vec![SERVICE_CIDR.parse().unwrap()],
        ..BackendConfig::default()
    }
}

impl Rig {
    /// `pods` pods with echo servers, and a backend made inside the node namespace.
    pub fn new(pods: usize, make: MakeBackend) -> Rig {
        let cluster = Cluster::new(ClusterSpec::pods(pods)).expect("cluster");
        let cfg = backend_config();
        let dp = cluster
            .node
            .run(|| make(&cfg))
            .expect("enter node netns")
            .expect("backend");
        let state = ProxyState::new(node_context());
        Rig {
            dp,
            state,
            cfg,
            cluster,
        }
    }

    /// Runs `f` with the backend on a thread inside the node namespace.
    pub fn in_node<T: Send>(&mut self, f: impl FnOnce(&mut dyn Dataplane) -> T + Send) -> T {
        let dp = &mut self.dp;
        self.cluster
            .node
            .run(move || f(dp.as_mut()))
            .expect("enter node netns")
    }

    /// Sets (or with `None` removes) one service port and syncs that change only.
    pub fn set(&mut self, svc: ServicePort, eps: Option<Vec<Endpoint>>) -> SyncStats {
        let spn = svc.name.clone();
        let changes = self.update_state(&spn, eps.map(|e| (svc, e)));
        self.sync(&changes).expect("sync")
    }

    /// Applies a desired change to the state and returns the change set the core would compute.
    pub fn update_state(
        &mut self,
        spn: &ServicePortName,
        new: Option<(ServicePort, Vec<Endpoint>)>,
    ) -> ChangeSet {
        let selected = |state: &ProxyState| {
            state
                .get(spn)
                .map(|p| p.selected.clone())
                .unwrap_or_default()
        };
        let before = selected(&self.state);
        match new {
            Some((svc, eps)) => {
                self.state.set_port(svc, eps);
            }
            None => {
                self.state.remove(spn);
            }
        }
        let after = selected(&self.state);
        let mut changes = ChangeSet {
            changed: BTreeSet::from([spn.clone()]),
            ..ChangeSet::default()
        };
        let gone: Vec<Endpoint> = before
            .cluster
            .iter()
            .chain(before.external.iter())
            .filter(|e| {
                !after
                    .cluster
                    .iter()
                    .chain(after.external.iter())
                    .any(|a| a.socket_addr() == e.socket_addr())
            })
            .cloned()
            .collect();
        if !gone.is_empty() {
            changes.removed_endpoints.insert(spn.clone(), gone);
        }
        if !before.any_usable && after.any_usable && spn.protocol.conntrack_cleaned() {
            changes.became_reachable.insert(spn.clone());
        }
        changes
    }

    pub fn sync(&mut self, changes: &ChangeSet) -> Result<SyncStats, DataplaneError> {
        let state = self.state.clone();
        let changes = changes.clone();
        self.in_node(move |dp| dp.sync(&state, &changes))
    }

    pub fn full_sync(&mut self) -> Result<SyncStats, DataplaneError> {
        self.sync(&ChangeSet {
            full: true,
            ..ChangeSet::default()
        })
    }

    /// Endpoints on pods `idx` (all ready, on this node unless `remote`).
    pub fn endpoints(&self, idx: &[usize], remote: bool) -> Vec<Endpoint> {
        idx.iter()
            .map(|i| endpoint(self.cluster.pods[*i].ip, remote))
            .collect()
    }
}

pub fn endpoint(ip: Ipv4Addr, remote: bool) -> Endpoint {
    Endpoint {
        addr: IpAddr::V4(ip),
        port: ECHO_PORT,
        node: Some(if remote { "other-node" } else { NODE_NAME }.into()),
        zone: None,
        ready: true,
        serving: true,
        terminating: false,
        hints: None,
    }
}

/// A ClusterIP service port `name` on `ip:port`.
pub fn service(name: &str, ip: &str, port: u16, protocol: Protocol) -> ServicePort {
    ServicePort {
        name: ServicePortName::new("default", name, "", protocol),
        cluster_ips: vec![ip.parse().unwrap()],
        port,
        protocol,
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

pub fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// Counts replies per pod name.
pub fn tally(replies: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in replies {
        *m.entry(r).or_default() += 1;
    }
    m
}

pub mod scenarios;
