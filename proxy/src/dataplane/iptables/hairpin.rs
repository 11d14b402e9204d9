//! Hairpin masquerade of the iptables backend: an endpoint reaching itself through its own
//! Service must be masqueraded. kube-proxy marks that in every per-endpoint chain; this layout
//! has none, so KPR-POSTROUTING sends DNATed connections to KPR-HAIRPIN, which dispatches on the
//! destination's /24 (IPv6: /120) to `KPR-HP-<prefix>`, where `-s EP -d EP` (source and
//! destination both the endpoint) masquerades. A new connection walks at most one rule per /24 of
//! endpoints plus one per endpoint address in that /24.
//!
//! Pure bookkeeping (no I/O): reference counts of endpoint addresses over all service ports, and
//! the /24 chains a sync must rewrite.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const HAIRPIN: &str = "KPR-HAIRPIN";

/// A /24 whose chain changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixChange {
    pub chain: String,
    /// Its rule in KPR-HAIRPIN (without `-A KPR-HAIRPIN`).
    pub dispatch: String,
    /// The chain's rules (without `-A CHAIN`); empty: no endpoint left in this /24.
    pub rules: Vec<String>,
    /// Whether the dispatch rule exists now (before this change is applied).
    pub dispatched: bool,
}

/// Endpoint addresses by /24, with how many service ports use each.
#[derive(Debug, Default)]
pub struct Hairpin {
    refs: HashMap<IpAddr, usize>,
    by_prefix: BTreeMap<IpAddr, BTreeSet<IpAddr>>,
    /// /24s whose dispatch rule is programmed.
    dispatched: BTreeSet<IpAddr>,
    dirty: BTreeSet<IpAddr>,
}

/// The address with its last 8 bits cleared, and the prefix length that leaves.
fn prefix(ip: IpAddr) -> (IpAddr, u8) {
    match ip {
        IpAddr::V4(v4) => (Ipv4Addr::from(u32::from(v4) & 0xffff_ff00).into(), 24),
        IpAddr::V6(v6) => (Ipv6Addr::from(u128::from(v6) & !0xff).into(), 120),
    }
}

/// One address as a host match (`/32`, `/128`).
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// The chain of the /24 `prefix`, e.g. `KPR-HP-0AF40100` for 10.244.1.0/24; an IPv6 /120 is
/// named by a hash of it (chain names are at most 28 characters).
pub fn chain(prefix: IpAddr) -> String {
    match prefix {
        IpAddr::V4(v4) => format!("KPR-HP-{:08X}", u32::from(v4)),
        IpAddr::V6(_) => format!("KPR-HP6-{}", super::compile::hash(&[&prefix.to_string()])),
    }
}

impl Hairpin {
    /// Forgets every address and dispatch rule (a full sync flushes KPR-HAIRPIN and re-adds all).
    pub fn clear(&mut self) {
        self.dirty.extend(self.by_prefix.keys().copied());
        self.refs.clear();
        self.by_prefix.clear();
        self.dispatched.clear();
    }

    /// A service port stopped using `old` and uses `new` now.
    pub fn update(&mut self, old: &BTreeSet<IpAddr>, new: &BTreeSet<IpAddr>) {
        for &ip in old.difference(new) {
            let Some(n) = self.refs.get_mut(&ip) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&ip);
                let p = prefix(ip).0;
                if let Some(set) = self.by_prefix.get_mut(&p) {
                    set.remove(&ip);
                    if set.is_empty() {
                        self.by_prefix.remove(&p);
                    }
                }
                self.dirty.insert(p);
            }
        }
        for &ip in new.difference(old) {
            let n = self.refs.entry(ip).or_default();
            *n += 1;
            if *n == 1 {
                let p = prefix(ip).0;
                self.by_prefix.entry(p).or_default().insert(ip);
                self.dirty.insert(p);
            }
        }
    }

    /// The /24 chains to rewrite; afterwards the dispatch rules are assumed programmed.
    pub fn take_changes(&mut self) -> Vec<PrefixChange> {
        let mut changes = Vec::new();
        for p in std::mem::take(&mut self.dirty) {
            let c = chain(p);
            let rules: Vec<String> = self
                .by_prefix
                .get(&p)
                .into_iter()
                .flatten()
                .map(|&ip| format!("-s {h} -d {h} -j MASQUERADE", h = host(ip)))
                .collect();
            let dispatched = if rules.is_empty() {
                self.dispatched.remove(&p)
            } else {
                !self.dispatched.insert(p)
            };
            changes.push(PrefixChange {
                dispatch: format!("-d {p}/{} -j {c}", prefix(p).1),
                chain: c,
                rules,
                dispatched,
            });
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ips: &[&str]) -> BTreeSet<IpAddr> {
        ips.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn an_address_counts_once_per_service_port_and_leaves_with_the_last() {
        let mut h = Hairpin::default();
        h.update(&set(&[]), &set(&["10.244.1.2", "10.244.1.3"]));
        h.update(&set(&[]), &set(&["10.244.1.2"]));
        let first = h.take_changes();
        assert_eq!(
            first,
            vec![PrefixChange {
                chain: "KPR-HP-0AF40100".into(),
                dispatch: "-d 10.244.1.0/24 -j KPR-HP-0AF40100".into(),
                rules: vec![
                    "-s 10.244.1.2/32 -d 10.244.1.2/32 -j MASQUERADE".into(),
                    "-s 10.244.1.3/32 -d 10.244.1.3/32 -j MASQUERADE".into(),
                ],
                dispatched: false,
            }]
        );
        // One of two users of 10.244.1.2 goes: nothing changes.
        h.update(&set(&["10.244.1.2"]), &set(&[]));
        assert!(h.take_changes().is_empty());
        // The last users go: the chain empties and its dispatch rule is to be deleted.
        h.update(&set(&["10.244.1.2", "10.244.1.3"]), &set(&[]));
        let last = h.take_changes();
        assert_eq!(last.len(), 1);
        assert!(last[0].rules.is_empty());
        assert!(last[0].dispatched);
    }

    #[test]
    fn after_clear_every_prefix_is_rewritten_and_dispatched_again() {
        let mut h = Hairpin::default();
        h.update(&set(&[]), &set(&["10.244.1.2", "10.244.7.2"]));
        h.take_changes();
        h.clear();
        h.update(&set(&[]), &set(&["10.244.1.2", "10.244.7.2"]));
        let again = h.take_changes();
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|c| !c.dispatched && c.rules.len() == 1));
    }
}
