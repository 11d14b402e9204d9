//! Endpoint choice for the userspace backend: round-robin cursors, exact least-connection counters,
//! Maglev lookups and ClientIP session affinity. Which endpoints are candidates is decided by
//! `selection::route` (and a Maglev Service port's table by `maglev`, with the selection); this
//! module only picks among them.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::maglev::MaglevTable;
use crate::model::{Algorithm, Endpoint, ServicePort, ServicePortName};
use crate::state::LiveView;

/// One new connection: the client and the Service address it was sent to (the Maglev flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub client: SocketAddr,
    pub service: SocketAddr,
}

/// Balancing state shared by every listener.
#[derive(Debug, Default)]
pub struct Balancer {
    cursors: Mutex<HashMap<ServicePortName, usize>>,
    active: Mutex<HashMap<SocketAddr, u64>>,
    affinity: Mutex<HashMap<(ServicePortName, IpAddr), (SocketAddr, Instant)>>,
}

/// Counts one active connection to an endpoint for as long as it lives.
#[derive(Debug)]
pub struct ActiveGuard {
    balancer: Arc<Balancer>,
    endpoint: SocketAddr,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut active = self.balancer.active.lock().expect("active counters lock");
        if let Some(n) = active.get_mut(&self.endpoint) {
            *n -= 1;
            if *n == 0 {
                active.remove(&self.endpoint);
            }
        }
    }
}

impl Balancer {
    /// Picks an endpoint for a new connection `flow`, skipping `exclude` (endpoints that
    /// refused this connection already). `maglev` is the candidates' table when the Service port
    /// is balanced with Maglev. `None` when no candidate is left.
    pub fn pick(
        &self,
        svc: &ServicePort,
        candidates: &[Endpoint],
        maglev: Option<&MaglevTable>,
        flow: Flow,
        exclude: &[SocketAddr],
    ) -> Option<SocketAddr> {
        let client = flow.client.ip();
        // A connection never changes IP family: a dual-stack Service's endpoints of the other
        // family are not candidates.
        let usable: Vec<SocketAddr> = candidates
            .iter()
            .map(Endpoint::socket_addr)
            .filter(|a| !exclude.contains(a) && a.is_ipv4() == client.is_ipv4())
            .collect();
        if usable.is_empty() {
            return None;
        }
        if let Some(timeout) = svc.affinity {
            let mut aff = self.affinity.lock().expect("affinity lock");
            let key = (svc.name.clone(), client);
            if let Some((ep, last)) = aff.get_mut(&key) {
                if last.elapsed() <= timeout && usable.contains(ep) {
                    *last = Instant::now();
                    return Some(*ep);
                }
            }
            let ep = self.choose(svc, &usable, maglev, flow);
            aff.insert(key, (ep, Instant::now()));
            return Some(ep);
        }
        Some(self.choose(svc, &usable, maglev, flow))
    }

    fn choose(
        &self,
        svc: &ServicePort,
        usable: &[SocketAddr],
        maglev: Option<&MaglevTable>,
        flow: Flow,
    ) -> SocketAddr {
        if let (Algorithm::Maglev, Some(table)) = (svc.algorithm, maglev) {
            if let Some(ep) = maglev_pick(table, flow, usable) {
                return ep;
            }
        }
        let start = {
            let mut cursors = self.cursors.lock().expect("cursor lock");
            let c = cursors.entry(svc.name.clone()).or_insert(0);
            let start = *c % usable.len();
            *c = c.wrapping_add(1);
            start
        };
        match svc.algorithm {
            // A Maglev port without a table of its candidates (none usable in it): round-robin.
            Algorithm::RoundRobin | Algorithm::Maglev => usable[start],
            Algorithm::LeastConn => {
                let active = self.active.lock().expect("active counters lock");
                crate::balance::least_loaded(
                    crate::balance::from_cursor(usable.len(), start).map(|i| usable[i]),
                    |a| active.get(a).copied().unwrap_or(0),
                )
                .expect("usable is not empty")
            }
        }
    }

    /// What [`pick`](Self::pick) would give the next new connection from `client` (without
    /// moving a cursor or touching an affinity entry), for `proxy trace`: the endpoint when the
    /// state decides it (affinity entry, Maglev slot with a known source port, the round-robin
    /// cursor, the least-loaded endpoint), and how. `None` when no candidate of the client's
    /// family is left, or a Maglev flow without its source port.
    pub fn peek(
        &self,
        svc: &ServicePort,
        candidates: &[Endpoint],
        maglev: Option<&MaglevTable>,
        client: IpAddr,
        client_port: Option<u16>,
        service: SocketAddr,
    ) -> (Option<SocketAddr>, String) {
        let usable: Vec<SocketAddr> = candidates
            .iter()
            .map(Endpoint::socket_addr)
            .filter(|a| a.is_ipv4() == client.is_ipv4())
            .collect();
        if usable.is_empty() {
            return (None, "no candidate of the client's family".into());
        }
        if let Some(timeout) = svc.affinity {
            let entry = self
                .affinity
                .lock()
                .expect("affinity lock")
                .get(&(svc.name.clone(), client))
                .copied();
            let why = match entry {
                Some((ep, last)) if last.elapsed() <= timeout && usable.contains(&ep) => {
                    return (
                        Some(ep),
                        format!(
                            "session affinity: this client's entry, last used {}s ago of {}s",
                            last.elapsed().as_secs(),
                            timeout.as_secs()
                        ),
                    );
                }
                Some((ep, last)) if usable.contains(&ep) => {
                    format!("affinity entry expired ({}s old)", last.elapsed().as_secs())
                }
                Some((ep, _)) => format!("affinity entry's {ep} is no candidate any more"),
                None => "no affinity entry for this client yet".into(),
            };
            let (pick, how) = self.peek_choice(svc, &usable, maglev, client, client_port, service);
            return (pick, format!("{why}; {how}"));
        }
        self.peek_choice(svc, &usable, maglev, client, client_port, service)
    }

    fn peek_choice(
        &self,
        svc: &ServicePort,
        usable: &[SocketAddr],
        maglev: Option<&MaglevTable>,
        client: IpAddr,
        client_port: Option<u16>,
        service: SocketAddr,
    ) -> (Option<SocketAddr>, String) {
        if let (Algorithm::Maglev, Some(table)) = (svc.algorithm, maglev) {
            let Some(port) = client_port else {
                return (
                    None,
                    "maglev: the slot depends on the source port (pass --src-port)".into(),
                );
            };
            let flow = Flow {
                client: SocketAddr::new(client, port),
                service,
            };
            let slot = table.slot_of(crate::maglev::flow_hash(flow.client, flow.service));
            if let Some(ep) = maglev_pick(table, flow, usable) {
                return (Some(ep), format!("maglev slot {slot} of {}", table.size()));
            }
        }
        let cursor = self
            .cursors
            .lock()
            .expect("cursor lock")
            .get(&svc.name)
            .copied()
            .unwrap_or(0);
        let start = cursor % usable.len();
        match svc.algorithm {
            Algorithm::RoundRobin | Algorithm::Maglev => (
                Some(usable[start]),
                format!(
                    "round robin: the cursor is at {start} of {} candidates",
                    usable.len()
                ),
            ),
            Algorithm::LeastConn => {
                let active = self.active.lock().expect("active counters lock");
                let pick = crate::balance::least_loaded(
                    crate::balance::from_cursor(usable.len(), start).map(|i| usable[i]),
                    |a| active.get(a).copied().unwrap_or(0),
                );
                let n = pick.map_or(0, |p| active.get(&p).copied().unwrap_or(0));
                (
                    pick,
                    format!("least connections: {n} active, the fewest (ties from the cursor at {start})"),
                )
            }
        }
    }

    /// Starts counting a connection to `endpoint`.
    pub fn acquire(self: &Arc<Self>, endpoint: SocketAddr) -> ActiveGuard {
        *self
            .active
            .lock()
            .expect("active counters lock")
            .entry(endpoint)
            .or_insert(0) += 1;
        ActiveGuard {
            balancer: self.clone(),
            endpoint,
        }
    }

    /// Forgets cursors and affinity of service ports that no longer exist.
    pub fn forget(&self, name: &ServicePortName) {
        self.cursors.lock().expect("cursor lock").remove(name);
        self.affinity
            .lock()
            .expect("affinity lock")
            .retain(|(n, _), _| n != name);
    }

    /// Drops expired affinity entries (called on every sync).
    pub fn expire_affinity(
        &self,
        timeout_of: impl Fn(&ServicePortName) -> Option<std::time::Duration>,
    ) {
        self.affinity
            .lock()
            .expect("affinity lock")
            .retain(|(name, _), (_, last)| timeout_of(name).is_some_and(|t| last.elapsed() <= t));
    }
}

/// The flow's endpoint in its Maglev table; when that one refused the connection already, the
/// endpoint of the next slot that is still a candidate (deterministic, like the table).
fn maglev_pick(table: &MaglevTable, flow: Flow, usable: &[SocketAddr]) -> Option<SocketAddr> {
    let first = table.slot_of(crate::maglev::flow_hash(flow.client, flow.service));
    (0..table.size())
        .map(|k| (first + k) % table.size())
        .filter_map(|slot| table.at(slot))
        .find(|ep| usable.contains(ep))
}

impl LiveView for Balancer {
    fn active_connections(&self) -> BTreeMap<SocketAddr, u64> {
        self.active
            .lock()
            .expect("active counters lock")
            .iter()
            .map(|(a, n)| (*a, *n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures;

    fn svc(algorithm: Algorithm, affinity: bool) -> ServicePort {
        ServicePort {
            cluster_ips: vec![],
            affinity: affinity.then(|| std::time::Duration::from_secs(60)),
            algorithm,
            ..fixtures::service_port("s", "10.96.0.10")
        }
    }

    fn eps(n: u8) -> Vec<Endpoint> {
        (1..=n)
            .map(|i| Endpoint {
                port: 80,
                node: None,
                ..fixtures::endpoint([10, 0, 0, i].into(), "")
            })
            .collect()
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    fn flow() -> Flow {
        flow_from(40000)
    }

    fn flow_from(port: u16) -> Flow {
        Flow {
            client: SocketAddr::new(CLIENT, port),
            service: "10.96.0.10:80".parse().unwrap(),
        }
    }

    #[test]
    fn maglev_follows_the_table_and_skips_refusing_endpoints() {
        let b = Balancer::default();
        let s = svc(Algorithm::Maglev, false);
        let e = eps(4);
        let table = crate::maglev::MaglevTable::new(
            e.iter().map(Endpoint::socket_addr),
            crate::maglev::TableSize::default(),
        );
        let mut seen = std::collections::HashSet::new();
        for port in 40000..40200 {
            let f = flow_from(port);
            let expect = table.pick(f.client, f.service).unwrap();
            assert_eq!(b.pick(&s, &e, Some(&table), f, &[]), Some(expect));
            assert_eq!(
                b.pick(&s, &e, Some(&table), f, &[]),
                Some(expect),
                "no cursor"
            );
            let other = b.pick(&s, &e, Some(&table), f, &[expect]).unwrap();
            assert_ne!(other, expect);
            seen.insert(expect);
        }
        assert_eq!(seen.len(), 4, "200 flows reach every endpoint");
    }

    #[test]
    fn round_robin_cycles_exactly() {
        let b = Balancer::default();
        let s = svc(Algorithm::RoundRobin, false);
        let picks: Vec<u8> = (0..8)
            .map(
                |_| match b.pick(&s, &eps(4), None, flow(), &[]).unwrap().ip() {
                    IpAddr::V4(v) => v.octets()[3],
                    IpAddr::V6(_) => unreachable!(),
                },
            )
            .collect();
        assert_eq!(picks, vec![1, 2, 3, 4, 1, 2, 3, 4]);
    }

    #[test]
    fn least_conn_avoids_busy_endpoints_and_counts_exactly() {
        let b = Arc::new(Balancer::default());
        let s = svc(Algorithm::LeastConn, false);
        let e = eps(3);
        let busy: Vec<ActiveGuard> = (0..5).map(|_| b.acquire(e[0].socket_addr())).collect();
        let mut held = Vec::new();
        for _ in 0..4 {
            let ep = b.pick(&s, &e, None, flow(), &[]).unwrap();
            assert_ne!(ep, e[0].socket_addr());
            held.push(b.acquire(ep));
        }
        let live = b.active_connections();
        assert_eq!(live[&e[0].socket_addr()], 5);
        assert_eq!(live[&e[1].socket_addr()], 2);
        assert_eq!(live[&e[2].socket_addr()], 2);
        drop(busy);
        drop(held);
        assert!(b.active_connections().is_empty());
    }

    /// What `peek` says is what the next `pick` gives, for every algorithm, and peeking moves
    /// nothing.
    #[test]
    fn peek_names_the_next_pick() {
        let service: SocketAddr = "10.96.0.10:80".parse().unwrap();
        let e = eps(3);
        for (algorithm, affinity) in [
            (Algorithm::RoundRobin, false),
            (Algorithm::LeastConn, false),
            (Algorithm::RoundRobin, true),
        ] {
            let b = Arc::new(Balancer::default());
            let s = svc(algorithm, affinity);
            let _busy = b.acquire(e[1].socket_addr());
            for _ in 0..5 {
                let (peeked, how) = b.peek(&s, &e, None, CLIENT, None, service);
                assert_eq!(
                    b.peek(&s, &e, None, CLIENT, None, service).0,
                    peeked,
                    "peeking twice gives the same"
                );
                assert_eq!(
                    b.pick(&s, &e, None, flow(), &[]),
                    peeked,
                    "{algorithm:?} {how}"
                );
            }
            let (_, how) = b.peek(&s, &e, None, CLIENT, None, service);
            assert_eq!(how.contains("affinity"), affinity, "{how}");
        }
        let s = svc(Algorithm::Maglev, false);
        let table = crate::maglev::MaglevTable::new(
            e.iter().map(Endpoint::socket_addr),
            crate::maglev::TableSize::default(),
        );
        let b = Balancer::default();
        let (none, how) = b.peek(&s, &e, Some(&table), CLIENT, None, service);
        assert!(none.is_none() && how.contains("--src-port"), "{how}");
        for port in 40000..40010 {
            let (peeked, _) = b.peek(&s, &e, Some(&table), CLIENT, Some(port), service);
            let f = flow_from(port);
            assert_eq!(peeked, b.pick(&s, &e, Some(&table), f, &[]));
        }
    }

    #[test]
    fn affinity_sticks_and_excluded_endpoints_are_skipped() {
        let b = Balancer::default();
        let s = svc(Algorithm::RoundRobin, true);
        let first = b.pick(&s, &eps(4), None, flow(), &[]).unwrap();
        for _ in 0..10 {
            assert_eq!(b.pick(&s, &eps(4), None, flow(), &[]).unwrap(), first);
        }
        let other = b.pick(&s, &eps(4), None, flow(), &[first]).unwrap();
        assert_ne!(other, first);
        assert_eq!(
            b.pick(&s, &eps(4), None, flow(), &[]).unwrap(),
            other,
            "affinity follows the endpoint that answered"
        );
        assert_eq!(
            b.pick(&s, &eps(1), None, flow(), &[eps(1)[0].socket_addr()]),
            None
        );
    }
}
