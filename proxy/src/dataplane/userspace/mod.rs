//! The userspace backend: a proxy in the agent that owns every Service connection.
//!
//! nftables (table `ip kpr-userspace`, see `rules`) redirects Service traffic to one TCP listener
//! (`tcp`) and to per-service-port UDP sockets (`udp`); the listeners look the original destination
//! up in `table` and pick an endpoint with `balancer`. It honours docs/SERVICE-SEMANTICS.md with
//! these documented exceptions, inherent to a proxy that opens its own connections: the endpoint
//! always sees the node as the source (no client-IP preservation under eTP Local); a TCP connection
//! that must be dropped is closed instead (the handshake has completed by then); IPv4 only; no
//! SCTP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, RwLock};

use crate::dataplane::{BackendConfig, Dataplane};

use crate::error::DataplaneError;
use crate::model::{Protocol, ServicePortName};
use crate::nft;
use crate::selection::DestKind;
use crate::state::{ChangeSet, LiveView, ProxyState, SyncStats};

mod balancer;
mod rules;
mod table;
mod tcp;
mod udp;

use balancer::Balancer;
use rules::Element;
use table::Table;

/// Removes the userspace backend's nftables table.
pub fn cleanup(_cfg: &BackendConfig) -> Result<(), DataplaneError> {
    nft::delete_table("ip", rules::TABLE)
}

pub struct UserspaceDataplane {
    cfg: BackendConfig,
    shared: tcp::Shared,
    tcp_port: u16,
    tcp_task: tokio::task::JoinHandle<()>,
    udp: udp::UdpListeners,
    programmed: HashMap<ServicePortName, Vec<Element>>,
    cluster_ip_refs: BTreeMap<Ipv4Addr, usize>,
    installed: bool,
}

impl Drop for UserspaceDataplane {
    fn drop(&mut self) {
        self.tcp_task.abort();
    }
}

impl UserspaceDataplane {
    /// Opens the TCP listener and checks nft. Must be called inside a tokio runtime.
    pub fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        nft::check_version()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            DataplaneError::Other("the userspace backend needs a tokio runtime".into())
        })?;
        let std_listener = std::net::TcpListener::bind("0.0.0.0:0")
            .map_err(|e| DataplaneError::io("binding the TCP listener", e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| DataplaneError::io("setting the TCP listener non-blocking", e))?;
        let tcp_port = std_listener
            .local_addr()
            .map_err(|e| DataplaneError::io("reading the TCP listener's port", e))?
            .port();
        let mut table = Table::default();
        table.nodeport_ips = cfg.nodeport_ips();
        let shared = tcp::Shared {
            table: Arc::new(RwLock::new(table)),
            balancer: Arc::new(Balancer::default()),
            node: Arc::new(cfg.node.clone()),
        };
        let listener = {
            let _g = rt.enter();
            tokio::net::TcpListener::from_std(std_listener)
                .map_err(|e| DataplaneError::io("registering the TCP listener", e))?
        };
        let tcp_task = rt.spawn(tcp::serve(listener, shared.clone()));
        tracing::info!(tcp_port, "userspace listener ready");
        Ok(UserspaceDataplane {
            cfg: cfg.clone(),
            udp: udp::UdpListeners::new(rt, shared.clone(), cfg.udp_idle_timeout),
            shared,
            tcp_port,
            tcp_task,
            programmed: HashMap::new(),
            cluster_ip_refs: BTreeMap::new(),
            installed: false,
        })
    }

    /// The elements of one service port, opening the UDP sockets it needs.
    fn port_elements(
        &mut self,
        state: &ProxyState,
        name: &ServicePortName,
    ) -> Result<Vec<Element>, DataplaneError> {
        let Some(port) = state.get(name) else {
            return Ok(Vec::new());
        };
        let (sp, sel) = (&*port.service, &port.selected);
        if sp.protocol == Protocol::Sctp {
            tracing::error!(service = %name, "the userspace backend does not support SCTP; this port is not proxied");
            return Ok(Vec::new());
        }
        let mut udp_ports: HashMap<DestKind, u16> = HashMap::new();
        if sp.protocol == Protocol::Udp {
            let mut kinds: Vec<DestKind> = table::destinations(sp)
                .into_iter()
                .map(|(_, k)| k)
                .collect();
            if sp.node_port != 0 {
                kinds.push(DestKind::NodePort);
            }
            for kind in kinds {
                udp_ports.insert(kind, self.udp.ensure((name.clone(), kind))?);
            }
        }
        Ok(rules::elements(sp, sel, &|k| {
            udp_ports.get(&k).copied().unwrap_or(0)
        }))
    }

    fn full_sync(&mut self, state: &ProxyState) -> Result<SyncStats, DataplaneError> {
        let mut all: HashMap<ServicePortName, Vec<Element>> = HashMap::new();
        for name in state.names() {
            all.insert(name.clone(), self.port_elements(state, name)?);
        }
        let refs = cluster_ip_refs(state, state.names());
        let ips: BTreeSet<Ipv4Addr> = refs.keys().copied().collect();
        let mut script = format!("table ip {t}\ndelete table ip {t}\n", t = rules::TABLE);
        script.push_str(&rules::base_table(self.tcp_port));
        let node = rules::node_elements(&self.cfg.nodeport_ips(), &self.cfg.service_cidrs, &ips);
        rules::element_commands(&mut script, "add", &node);
        let elems: Vec<Element> = all.values().flatten().cloned().collect();
        rules::element_commands(&mut script, "add", &elems);
        nft::apply(&script)?;
        let mut table = self.shared.table.write().expect("table lock");
        table.clear();
        for name in state.names() {
            table.update(state, name);
        }
        drop(table);
        self.udp.retain(|(n, _)| {
            state
                .service(n)
                .is_some_and(|sp| sp.protocol == Protocol::Udp)
        });
        self.programmed = all;
        self.cluster_ip_refs = refs;
        self.installed = true;
        Ok(SyncStats {
            full: true,
            service_ports: state.len(),
            touched: state.len(),
            operations: elems.len() + node.len(),
        })
    }

    /// Programs only the changed service ports: their elements, the clusterIPs whose reference
    /// count went to or from zero, and their UDP listeners; O(changes), whatever the number of
    /// Services. A failure leaves the bookkeeping to the full resync it triggers.
    fn partial_sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<SyncStats, DataplaneError> {
        let mut adds = Vec::new();
        let mut dels = Vec::new();
        let mut new_programmed = Vec::new();
        for name in &changes.changed {
            let old = self.programmed.get(name).cloned().unwrap_or_default();
            let new = self.port_elements(state, name)?;
            dels.extend(old.iter().filter(|e| !new.contains(e)).cloned());
            adds.extend(new.iter().filter(|e| !old.contains(e)).cloned());
            new_programmed.push((name.clone(), new));
        }
        let (gone, came) = self.move_cluster_ip_refs(state, &changes.changed);
        dels.extend(gone.iter().map(|ip| ("cluster_ips", ip.to_string())));
        adds.extend(came.iter().map(|ip| ("cluster_ips", ip.to_string())));
        let mut script = String::new();
        rules::element_commands(&mut script, "delete", &dels);
        rules::element_commands(&mut script, "add", &adds);
        if !script.is_empty() {
            nft::apply(&script)?;
        }
        {
            let mut table = self.shared.table.write().expect("table lock");
            for name in &changes.changed {
                table.update(state, name);
            }
        }
        for (name, elems) in new_programmed {
            if state.contains(&name) {
                self.programmed.insert(name, elems);
            } else {
                self.programmed.remove(&name);
                self.shared.balancer.forget(&name);
            }
        }
        let udp_now = |n: &ServicePortName| {
            state
                .service(n)
                .is_some_and(|sp| sp.protocol == Protocol::Udp)
        };
        self.udp
            .retain(|(n, _)| !changes.changed.contains(n) || udp_now(n));
        Ok(SyncStats {
            full: false,
            service_ports: state.len(),
            touched: changes.changed.len(),
            operations: adds.len() + dels.len(),
        })
    }

    /// Moves the clusterIP references of `changed` from their programmed versions to `state`'s.
    fn move_cluster_ip_refs(
        &mut self,
        state: &ProxyState,
        changed: &BTreeSet<ServicePortName>,
    ) -> (BTreeSet<Ipv4Addr>, BTreeSet<Ipv4Addr>) {
        let old = self.cluster_ip_refs_of(changed);
        let new = cluster_ip_refs(state, changed.iter());
        move_refs(&mut self.cluster_ip_refs, &old, &new)
    }

    /// The cluster IPs the currently programmed versions of `names` hold references to.
    fn cluster_ip_refs_of(&self, names: &BTreeSet<ServicePortName>) -> BTreeMap<Ipv4Addr, usize> {
        let mut refs = BTreeMap::new();
        for name in names {
            for (set, e) in self.programmed.get(name).into_iter().flatten() {
                if *set == "svc_ports" {
                    if let Some(ip) = e.split(' ').next().and_then(|s| s.parse::<Ipv4Addr>().ok()) {
                        *refs.entry(ip).or_insert(0) += 1;
                    }
                }
            }
        }
        refs
    }
}

/// Takes `old` references out of `refs` and puts `new` in; returns the addresses nobody holds
/// any more and those that nobody held before.
fn move_refs(
    refs: &mut BTreeMap<Ipv4Addr, usize>,
    old: &BTreeMap<Ipv4Addr, usize>,
    new: &BTreeMap<Ipv4Addr, usize>,
) -> (BTreeSet<Ipv4Addr>, BTreeSet<Ipv4Addr>) {
    let (mut gone, mut came) = (BTreeSet::new(), BTreeSet::new());
    for (ip, n) in old {
        let left = refs.get(ip).map_or(0, |r| r.saturating_sub(*n));
        if left == 0 {
            refs.remove(ip);
            gone.insert(*ip);
        } else {
            refs.insert(*ip, left);
        }
    }
    for (ip, n) in new {
        let r = refs.entry(*ip).or_insert(0);
        if *r == 0 && !gone.remove(ip) {
            came.insert(*ip);
        }
        *r += n;
    }
    (gone, came)
}

/// Counts, per IPv4 cluster IP, the service ports that use it.
fn cluster_ip_refs<'a>(
    state: &ProxyState,
    names: impl Iterator<Item = &'a ServicePortName>,
) -> BTreeMap<Ipv4Addr, usize> {
    let mut refs = BTreeMap::new();
    for name in names {
        let Some(sp) = state
            .service(name)
            .filter(|sp| sp.protocol != Protocol::Sctp)
        else {
            continue;
        };
        for ip in &sp.cluster_ips {
            if let IpAddr::V4(v4) = ip {
                *refs.entry(*v4).or_insert(0) += 1;
            }
        }
    }
    refs
}

impl Dataplane for UserspaceDataplane {
    fn name(&self) -> &'static str {
        "userspace"
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<SyncStats, DataplaneError> {
        let stats = if changes.full || !self.installed {
            self.full_sync(state)?
        } else {
            self.partial_sync(state, changes)?
        };
        self.shared
            .balancer
            .expire_affinity(|n| state.service(n).and_then(|sp| sp.affinity));
        Ok(stats)
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        self.installed = false;
        cleanup(&self.cfg)
    }

    fn live_view(&self) -> Option<Arc<dyn LiveView>> {
        Some(self.shared.balancer.clone())
    }
}

#[cfg(test)]
mod refs_tests {
    use super::*;

    fn refs(v: &[(&str, usize)]) -> BTreeMap<Ipv4Addr, usize> {
        v.iter().map(|(ip, n)| (ip.parse().unwrap(), *n)).collect()
    }

    fn ips(v: &[&str]) -> BTreeSet<Ipv4Addr> {
        v.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn a_shared_cluster_ip_stays_until_its_last_port_goes() {
        let mut all = refs(&[("10.96.0.1", 2), ("10.96.0.2", 1)]);
        // One of the two ports of 10.96.0.1 goes: nothing to program.
        let (gone, came) = move_refs(&mut all, &refs(&[("10.96.0.1", 1)]), &refs(&[]));
        assert!(gone.is_empty() && came.is_empty());
        assert_eq!(all, refs(&[("10.96.0.1", 1), ("10.96.0.2", 1)]));
        // The last one goes, and a new address comes.
        let (gone, came) = move_refs(
            &mut all,
            &refs(&[("10.96.0.1", 1)]),
            &refs(&[("10.96.0.3", 1)]),
        );
        assert_eq!((gone, came), (ips(&["10.96.0.1"]), ips(&["10.96.0.3"])));
        assert_eq!(all, refs(&[("10.96.0.2", 1), ("10.96.0.3", 1)]));
    }

    #[test]
    fn a_port_that_keeps_its_address_programs_nothing() {
        let mut all = refs(&[("10.96.0.2", 1)]);
        let same = refs(&[("10.96.0.2", 1)]);
        let (gone, came) = move_refs(&mut all, &same, &same);
        assert!(gone.is_empty() && came.is_empty());
        assert_eq!(all, same);
    }
}
