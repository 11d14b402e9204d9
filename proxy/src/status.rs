//! What the agent reports about itself: health (for `/healthz`) and the state view that
//! `GET /state` serves and `proxy inspect` prints.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::{IpFamily, ServicePort};
use crate::selection::NodeContext;
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
    /// Wakes [`Health::first_programmed`]'s waiters on every successful sync.
    programmed_notify: tokio::sync::Notify,
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
        self.programmed_notify.notify_waiters();
    }

    /// Returns once a sync has succeeded (at once if one already has).
    pub async fn first_programmed(&self) {
        loop {
            // Registered before the check, so a sync finishing in between still wakes it.
            let notified = self.programmed_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.programmed_once() {
                return;
            }
            notified.await;
        }
    }

    /// Whether a sync has succeeded yet (the first one programs the initial listing).
    pub fn programmed_once(&self) -> bool {
        self.last_ok_ms.load(Ordering::Relaxed) != 0
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
    /// Address families of the port's addresses that are not programmed, each with why
    /// (`IPv6: the node has no IPv6 address`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unserved: Vec<String>,
    /// A Maglev Service port's tables: one per endpoint set and family that has endpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maglev: Vec<MaglevView>,
}

/// One Maglev table as `proxy inspect` shows it: its size and each endpoint's slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaglevView {
    /// `cluster` (clusterIP and short-circuited traffic) or `external` (external sources under
    /// externalTrafficPolicy Local), and the family: `cluster IPv4`.
    pub set: String,
    pub table_size: u32,
    /// Slots per endpoint, in the table's endpoint order.
    pub slots: Vec<(SocketAddr, u32)>,
}

/// The tables of a Maglev selection, the external set only where it differs.
fn maglev_views(sel: &crate::selection::SelectedEndpoints) -> Vec<MaglevView> {
    let Some(t) = sel.maglev.as_deref() else {
        return Vec::new();
    };
    let mut sets = vec![("cluster", &t.cluster)];
    if !std::sync::Arc::ptr_eq(&t.cluster, &t.external) {
        sets.push(("external", &t.external));
    }
    let mut out = Vec::new();
    for (name, tables) in sets {
        for family in IpFamily::ALL {
            let table = tables.of(family);
            if !table.is_empty() {
                out.push(MaglevView {
                    set: format!("{name} {family}"),
                    table_size: table.size(),
                    slots: table.slot_counts(),
                });
            }
        }
    }
    out
}

/// The families this node does not serve with this backend, each with the reason.
pub fn unserved_families(
    backend: &str,
    programmed: &[IpFamily],
    node: &NodeContext,
) -> Vec<(IpFamily, String)> {
    IpFamily::ALL
        .into_iter()
        .filter_map(|f| {
            if !programmed.contains(&f) {
                let only: Vec<String> = programmed.iter().map(ToString::to_string).collect();
                return Some((
                    f,
                    format!("the {backend} backend programs {} only", only.join(" and ")),
                ));
            }
            let has = node
                .node_ips
                .iter()
                .any(|ip| IpFamily::of(ip) == f && !ip.is_loopback());
            (!has).then(|| (f, format!("the node has no {f} address")))
        })
        .collect()
}

/// The families of `sp`'s addresses among `unserved`.
pub fn unserved_of<'a>(
    sp: &'a ServicePort,
    unserved: &'a [(IpFamily, String)],
) -> impl Iterator<Item = &'a (IpFamily, String)> + 'a {
    unserved.iter().filter(move |(f, _)| sp.has_family(*f))
}

/// Everything `GET /state` returns.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StateView {
    pub backend: String,
    pub synced: bool,
    /// Changes received and not programmed yet: `services` already shows them (it is the
    /// agent's model), the dataplane does not until the next sync.
    #[serde(default)]
    pub pending: bool,
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
    unserved: &[(IpFamily, String)],
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
                unserved: unserved_of(sp, unserved)
                    .map(|(f, why)| format!("{f}: {why}"))
                    .collect(),
                maglev: maglev_views(sel),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maglev_ports_show_their_tables() {
        let mut state = ProxyState::default();
        let mut sp = crate::model::fixtures::service_port("web", "10.96.0.10");
        let eps: Vec<_> = (1..=3)
            .map(|i| crate::model::fixtures::endpoint([10, 244, i, 2].into(), "n"))
            .collect();
        state.set_port(sp.clone(), eps.clone());
        let views = service_views(&state, &BTreeMap::new(), false, &[]);
        assert!(views[0].maglev.is_empty(), "round-robin has no table");
        sp.algorithm = crate::model::Algorithm::Maglev;
        state.set_port(sp, eps);
        let views = service_views(&state, &BTreeMap::new(), false, &[]);
        let m = &views[0].maglev;
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].set.as_str(), m[0].table_size),
            ("cluster IPv4", 16381)
        );
        let counts: Vec<u32> = m[0].slots.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts.iter().sum::<u32>(), 16381);
        assert!(
            counts.iter().all(|n| (5460..=5461).contains(n)),
            "{counts:?}"
        );
    }

    #[test]
    fn families_are_unserved_by_the_backend_or_by_the_node() {
        let node = |ips: &[&str]| NodeContext {
            node_ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..NodeContext::default()
        };
        let dual = node(&["192.0.2.1", "2001:db8::1", "::1"]);
        assert_eq!(unserved_families("nftables", &IpFamily::ALL, &dual), []);
        assert_eq!(
            unserved_families("iptables", &[IpFamily::V4], &dual),
            [(
                IpFamily::V6,
                "the iptables backend programs IPv4 only".into()
            )]
        );
        // Loopback is no address to serve from.
        let v4 = node(&["192.0.2.1", "::1"]);
        let unserved = unserved_families("nftables", &IpFamily::ALL, &v4);
        assert_eq!(
            unserved,
            [(IpFamily::V6, "the node has no IPv6 address".into())]
        );
        let mut sp = crate::model::fixtures::service_port("web", "10.96.0.10");
        assert_eq!(unserved_of(&sp, &unserved).count(), 0);
        sp.external_ips.push("2001:db8::10".parse().unwrap());
        assert_eq!(unserved_of(&sp, &unserved).count(), 1);
    }

    #[tokio::test]
    async fn first_programmed_waits_for_a_successful_sync_only() {
        let health = std::sync::Arc::new(Health::default());
        let waiter = tokio::spawn({
            let health = health.clone();
            async move { health.first_programmed().await }
        });
        health.queued();
        health.set_synced();
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "returned before any sync was programmed"
        );
        health.programmed();
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("still waiting after the first sync was programmed")
            .unwrap();
        // Once programmed, later callers return at once.
        tokio::time::timeout(Duration::from_secs(10), health.first_programmed())
            .await
            .unwrap();
    }
}
