//! What the agent reports about itself: health (for `/healthz`) and the state view that
//! `GET /state` serves and `proxy inspect` prints.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::state::ProxyState;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Health as `/healthz` sees it, shared between the sync runner and the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    /// Unix ms of the oldest change not yet programmed; 0 when none is pending.
    pending_since_ms: AtomicU64,
    last_ok_ms: AtomicU64,
}

impl Health {
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    pub fn queued(&self) {
        let _ = self.pending_since_ms.compare_exchange(
            0,
            now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub fn programmed(&self) {
        self.pending_since_ms.store(0, Ordering::Relaxed);
        self.last_ok_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Healthy once the first sync succeeded, as long as no change waits longer than `timeout`.
    pub fn healthy(&self, timeout: Duration) -> Result<(), String> {
        if self.last_ok_ms.load(Ordering::Relaxed) == 0 {
            return Err("initial sync not done yet".into());
        }
        let pending = self.pending_since_ms.load(Ordering::Relaxed);
        if pending != 0 && now_ms().saturating_sub(pending) > timeout.as_millis() as u64 {
            return Err(format!(
                "changes pending for more than {}s",
                timeout.as_secs()
            ));
        }
        Ok(())
    }
}

/// The outcome of the last sync.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LastSync {
    pub at_unix_ms: u64,
    pub duration_ms: f64,
    pub full: bool,
    pub touched: usize,
    pub operations: usize,
    pub error: Option<String>,
}

impl LastSync {
    pub fn now(duration: Duration, full: bool) -> Self {
        LastSync {
            at_unix_ms: now_ms(),
            duration_ms: duration.as_secs_f64() * 1000.0,
            full,
            ..Default::default()
        }
    }
}

/// One endpoint as `proxy inspect` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndpointView {
    pub addr: SocketAddr,
    pub node: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Used for cluster traffic (clusterIP, pod sources).
    pub cluster: bool,
    /// Used for external traffic from external sources.
    pub external: bool,
    /// Active connections through this node's dataplane, where the backend counts them.
    pub active: Option<u64>,
}

/// One service port as `proxy inspect` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceView {
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub protocol: String,
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub algorithm: String,
    pub affinity_seconds: Option<u64>,
    pub external_local: bool,
    pub internal_local: bool,
    pub endpoints: Vec<EndpointView>,
}

/// Everything `GET /state` returns.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StateView {
    pub backend: String,
    pub synced: bool,
    pub last_sync: Option<LastSync>,
    pub services: Vec<ServiceView>,
    /// Input problems (bad manifests, invalid fields), each naming its object and field.
    pub errors: Vec<String>,
}

/// Builds the service list of a [`StateView`] from the programmed state and live counters.
pub fn service_views(
    state: &ProxyState,
    active: &BTreeMap<SocketAddr, u64>,
    counts: bool,
) -> Vec<ServiceView> {
    state
        .iter()
        .map(|(name, port)| {
            let (sp, sel) = (&port.service, &port.selected);
            let in_set = |set: &[crate::model::Endpoint], a: SocketAddr| {
                set.iter().any(|e| e.socket_addr() == a)
            };
            let endpoints = port
                .endpoints
                .iter()
                .map(|e| EndpointView {
                    addr: e.socket_addr(),
                    node: e.node.as_deref().map(str::to_string),
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                    cluster: in_set(&sel.cluster, e.socket_addr()),
                    external: in_set(&sel.external, e.socket_addr()),
                    active: counts.then(|| active.get(&e.socket_addr()).copied().unwrap_or(0)),
                })
                .collect();
            ServiceView {
                name: name.to_string(),
                cluster_ips: sp.cluster_ips.clone(),
                port: sp.port,
                protocol: sp.protocol.to_string(),
                node_port: sp.node_port,
                external_ips: sp.external_ips.clone(),
                load_balancer_ips: sp.load_balancer_ips.clone(),
                algorithm: sp.algorithm.to_string(),
                affinity_seconds: sp.affinity.map(|d| d.as_secs()),
                external_local: sp.external_local,
                internal_local: sp.internal_local,
                endpoints,
            }
        })
        .collect()
}
