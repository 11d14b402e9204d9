//! The userspace backend: a proxy in the agent that owns every Service connection.
//!
//! nftables (tables `ip kpr-userspace` and `ip6 kpr-userspace`, see `rules`) redirects Service
//! traffic to one TCP listener per address family (`tcp`) and to per-service-port UDP sockets
//! (`udp`); the listeners look the original destination up in `table` and pick an endpoint of the
//! connection's family with `balancer`. It honours docs/SERVICE-SEMANTICS.md with these documented
//! exceptions, inherent to a proxy that opens its own connections: the endpoint always sees the
//! node as the source (no client-IP preservation under eTP Local); a TCP connection that must be
//! dropped is closed instead (the handshake has completed by then); no SCTP. IPv6 is served where
//! the kernel has it (`/proc/sys/net/ipv6`) and an IPv6 listener can be opened. `trace` answers
//! `proxy trace` (the table's verdict, and the listener's next pick from the balancer's state).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use crate::dataplane::{kernel_families, BackendConfig, Dataplane};

use crate::error::DataplaneError;
use crate::model::{IpFamily, Protocol, ServicePortName};
use crate::nft;
use crate::selection::DestKind;
use crate::state::{ChangeSet, LiveView, ProxyState, SyncStats};

mod balancer;
mod rules;
mod table;
mod tcp;
pub mod trace;
mod udp;

use balancer::Balancer;
use rules::Element;
use table::Table;

/// Removes the userspace backend's nftables tables.
pub fn cleanup(_cfg: &BackendConfig) -> Result<(), DataplaneError> {
    for &f in kernel_families() {
        nft::delete_table(rules::nft_family(f).0, rules::TABLE)?;
    }
    Ok(())
}

/// One family's TCP listener: its port (what that family's table redirects to) and its task.
struct TcpListener {
    family: IpFamily,
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

pub struct UserspaceDataplane {
    cfg: BackendConfig,
    shared: tcp::Shared,
    /// IPv4's, then IPv6's where the node serves it.
    tcp: Vec<TcpListener>,
    udp: udp::UdpListeners,
    programmed: HashMap<ServicePortName, Vec<Element>>,
    cluster_ip_refs: BTreeMap<IpAddr, usize>,
    installed: bool,
}

impl Drop for UserspaceDataplane {
    fn drop(&mut self) {
        for l in &self.tcp {
            l.task.abort();
        }
    }
}

impl UserspaceDataplane {
    /// Opens the TCP listeners and checks nft. Must be called inside a tokio runtime.
    pub fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        nft::check_version()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            DataplaneError::Other("the userspace backend needs a tokio runtime".into())
        })?;
        let mut table = Table::default();
        table.nodeport_ips = cfg.nodeport_ips();
        let shared = tcp::Shared {
            table: Arc::new(RwLock::new(table)),
            balancer: Arc::new(Balancer::default()),
            node: Arc::new(cfg.node.clone()),
        };
        let mut listeners = Vec::new();
        for &family in kernel_families() {
            let std_listener = match tcp::bind(family) {
                Ok(l) => l,
                // IPv4 is the one family the backend cannot do without; a node whose IPv6 cannot
                // take a listener serves IPv4, and its IPv6 Services are reported as not served.
                Err(e) if family == IpFamily::V6 => {
                    tracing::warn!("no IPv6 TCP listener ({e}): IPv6 Services are not served");
                    continue;
                }
                Err(e) => return Err(DataplaneError::io("opening the IPv4 TCP listener", e)),
            };
            let port = std_listener
                .local_addr()
                .map_err(|e| DataplaneError::io("reading the TCP listener's port", e))?
                .port();
            let listener = {
                let _g = rt.enter();
                tokio::net::TcpListener::from_std(std_listener)
                    .map_err(|e| DataplaneError::io("registering the TCP listener", e))?
            };
            let task = rt.spawn(tcp::serve(listener, shared.clone()));
            tracing::info!(%family, tcp_port = port, "userspace listener ready");
            listeners.push(TcpListener { family, port, task });
        }
        Ok(UserspaceDataplane {
            cfg: cfg.clone(),
            udp: udp::UdpListeners::new(rt, shared.clone(), cfg.udp_idle_timeout),
            shared,
            tcp: listeners,
            programmed: HashMap::new(),
            cluster_ip_refs: BTreeMap::new(),
            installed: false,
        })
    }

    /// The families this node's listeners serve.
    fn served(&self) -> &'static [IpFamily] {
        if self.tcp.iter().any(|l| l.family == IpFamily::V6) {
            &IpFamily::ALL
        } else {
            &[IpFamily::V4]
        }
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
        let families = self.served();
        let mut udp_ports: HashMap<(DestKind, IpFamily), u16> = HashMap::new();
        if sp.protocol == Protocol::Udp {
            let mut wanted: Vec<(DestKind, IpFamily)> = table::destinations(sp)
                .into_iter()
                .map(|(ip, k)| (k, IpFamily::of(&ip)))
                .collect();
            if sp.node_port != 0 {
                wanted.extend(IpFamily::ALL.map(|f| (DestKind::NodePort, f)));
            }
            for (kind, family) in wanted {
                if families.contains(&family) && sp.has_family(family) {
                    let port = self.udp.ensure((name.clone(), kind, family))?;
                    udp_ports.insert((kind, family), port);
                }
            }
        }
        Ok(rules::elements(sp, sel, families, &|k, f| {
            udp_ports.get(&(k, f)).copied().unwrap_or(0)
        }))
    }

    fn full_sync(&mut self, state: &ProxyState) -> Result<SyncStats, DataplaneError> {
        let mut all: HashMap<ServicePortName, Vec<Element>> = HashMap::new();
        for name in state.names() {
            all.insert(name.clone(), self.port_elements(state, name)?);
        }
        let refs = cluster_ip_refs(state, state.names());
        let ips: BTreeSet<IpAddr> = refs.keys().copied().collect();
        let mut script = String::new();
        for l in &self.tcp {
            let fam = rules::nft_family(l.family).0;
            script.push_str(&format!(
                "table {fam} {t}\ndelete table {fam} {t}\n",
                t = rules::TABLE
            ));
            script.push_str(&rules::base_table(l.family, l.port));
        }
        let node = rules::node_elements(
            self.served(),
            &self.cfg.nodeport_ips(),
            &self.cfg.service_cidrs,
            &ips,
        );
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
        self.udp.retain(|(n, _, _)| {
            state
                .service(n)
                .is_some_and(|sp| sp.protocol == Protocol::Udp)
        });
        self.programmed = all;
        self.cluster_ip_refs = refs;
        self.installed = true;
        // Flows an earlier process's sockets served (a restart, or a switch from this backend
        // and back) go to the sockets that serve them now on their next datagram.
        let stale = crate::conntrack::redirected_elsewhere(state, &self.udp.ports());
        if let Err(e) = crate::conntrack::delete_matching(&stale) {
            tracing::warn!("conntrack cleanup of the previous listeners' UDP flows: {e}");
        }
        Ok(SyncStats {
            full: true,
            service_ports: state.len(),
            touched: state.len(),
            operations: elems.len() + node.len(),
            ..SyncStats::default()
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
        let served = self.served();
        dels.extend(rules::node_elements(served, &[], &[], &gone));
        adds.extend(rules::node_elements(served, &[], &[], &came));
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
            .retain(|(n, _, _)| !changes.changed.contains(n) || udp_now(n));
        Ok(SyncStats {
            full: false,
            service_ports: state.len(),
            touched: changes.changed.len(),
            operations: adds.len() + dels.len(),
            ..SyncStats::default()
        })
    }

    /// Moves the clusterIP references of `changed` from their programmed versions to `state`'s.
    fn move_cluster_ip_refs(
        &mut self,
        state: &ProxyState,
        changed: &BTreeSet<ServicePortName>,
    ) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
        let old = self.cluster_ip_refs_of(changed);
        let new = cluster_ip_refs(state, changed.iter());
        move_refs(&mut self.cluster_ip_refs, &old, &new)
    }

    /// The cluster IPs the currently programmed versions of `names` hold references to.
    fn cluster_ip_refs_of(&self, names: &BTreeSet<ServicePortName>) -> BTreeMap<IpAddr, usize> {
        let mut refs = BTreeMap::new();
        for name in names {
            for (_, set, e) in self.programmed.get(name).into_iter().flatten() {
                if *set == "svc_ports" {
                    if let Some(ip) = e.split(' ').next().and_then(|s| s.parse::<IpAddr>().ok()) {
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
    refs: &mut BTreeMap<IpAddr, usize>,
    old: &BTreeMap<IpAddr, usize>,
    new: &BTreeMap<IpAddr, usize>,
) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
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

/// Counts, per cluster IP, the service ports that use it.
fn cluster_ip_refs<'a>(
    state: &ProxyState,
    names: impl Iterator<Item = &'a ServicePortName>,
) -> BTreeMap<IpAddr, usize> {
    let mut refs = BTreeMap::new();
    for name in names {
        let Some(sp) = state
            .service(name)
            .filter(|sp| sp.protocol != Protocol::Sctp)
        else {
            continue;
        };
        for ip in &sp.cluster_ips {
            *refs.entry(*ip).or_insert(0) += 1;
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

    fn trace(
        &self,
        q: &crate::dataplane::TraceQuery,
    ) -> Result<crate::dataplane::TraceView, String> {
        Ok(trace::listener(&self.shared, q))
    }

    fn families(&self) -> &'static [IpFamily] {
        self.served()
    }
}

#[cfg(test)]
mod refs_tests {
    use super::*;

    fn refs(v: &[(&str, usize)]) -> BTreeMap<IpAddr, usize> {
        v.iter().map(|(ip, n)| (ip.parse().unwrap(), *n)).collect()
    }

    fn ips(v: &[&str]) -> BTreeSet<IpAddr> {
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
