//! The LoadBalancer address pool and its allocator: pure, no I/O.
//!
//! A pool is a CIDR (`192.168.100.0/28`, host addresses only) or an inclusive range
//! (`192.168.100.10-192.168.100.20`). The allocator maps each Service key to one address and never
//! gives one address to two Services; `rebuild` recreates the map from the addresses Services
//! already carry, so a restart hands out no duplicates.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use crate::error::Error;

/// A configured address pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    spec: String,
    first: u128,
    last: u128,
    v4: bool,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a).into(),
        IpAddr::V6(a) => a.into(),
    }
}

fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(u32::try_from(n).expect("IPv4 pool bounds fit u32").into())
    } else {
        IpAddr::V6(n.into())
    }
}

impl FromStr for Pool {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let err = |reason: &str| Error::Pool {
            pool: s.to_string(),
            reason: reason.to_string(),
        };
        let (first, last) = if let Some((a, b)) = s.split_once('-') {
            let a: IpAddr = a
                .trim()
                .parse()
                .map_err(|_| err("range start is not an IP address"))?;
            let b: IpAddr = b
                .trim()
                .parse()
                .map_err(|_| err("range end is not an IP address"))?;
            if a.is_ipv4() != b.is_ipv4() {
                return Err(err("range ends are of different IP families"));
            }
            (a, b)
        } else {
            let net: IpNet = s
                .trim()
                .parse()
                .map_err(|_| err("expected a CIDR (a.b.c.d/n) or a range (a-b)"))?;
            let mut hosts = net.hosts();
            let first = hosts
                .next()
                .ok_or_else(|| err("the CIDR has no host addresses"))?;
            let last = hosts.next_back().unwrap_or(first);
            (first, last)
        };
        let (first_n, last_n) = (to_u128(first), to_u128(last));
        if first_n > last_n {
            return Err(err("range start is after its end"));
        }
        Ok(Self {
            spec: s.to_string(),
            first: first_n,
            last: last_n,
            v4: first.is_ipv4(),
        })
    }
}

impl Pool {
    /// Whether an address lies in the pool.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.v4 && (self.first..=self.last).contains(&to_u128(ip))
    }

    /// Number of addresses.
    pub fn size(&self) -> u128 {
        self.last - self.first + 1
    }
}

/// Address assignments out of one pool.
#[derive(Debug, Clone)]
pub struct Allocator {
    pool: Pool,
    by_ip: BTreeMap<u128, String>,
    by_key: HashMap<String, IpAddr>,
    cursor: u128,
}

impl Allocator {
    /// An empty allocator over `pool`.
    pub fn new(pool: Pool) -> Self {
        let cursor = pool.first;
        Self {
            pool,
            by_ip: BTreeMap::new(),
            by_key: HashMap::new(),
            cursor,
        }
    }

    /// Records that `key` holds `ip` (from a Service's status at start-up). False, and nothing
    /// recorded, when the address is outside the pool or already held by another key.
    pub fn claim(&mut self, key: &str, ip: IpAddr) -> bool {
        if !self.pool.contains(ip) {
            return false;
        }
        match self.by_ip.get(&to_u128(ip)) {
            Some(holder) => holder == key,
            None => {
                self.release(key);
                self.by_ip.insert(to_u128(ip), key.to_string());
                self.by_key.insert(key.to_string(), ip);
                true
            }
        }
    }

    /// The address held by `key`, allocating one if needed: `preferred` (a requested or
    /// previously published address) when it is free, else the next free one.
    pub fn ensure(&mut self, key: &str, preferred: Option<IpAddr>) -> Result<IpAddr, Error> {
        if let Some(ip) = self.by_key.get(key) {
            return Ok(*ip);
        }
        if let Some(ip) = preferred.filter(|ip| self.claim(key, *ip)) {
            return Ok(ip);
        }
        let size = self.pool.size();
        let mut n = self.cursor;
        for _ in 0..size.min(1 << 24) {
            if !self.by_ip.contains_key(&n) {
                let ip = from_u128(n, self.pool.v4);
                self.cursor = if n == self.pool.last {
                    self.pool.first
                } else {
                    n + 1
                };
                self.claim(key, ip);
                return Ok(ip);
            }
            n = if n == self.pool.last {
                self.pool.first
            } else {
                n + 1
            };
        }
        Err(Error::Pool {
            pool: self.pool.spec.clone(),
            reason: format!("exhausted ({size} addresses all assigned)"),
        })
    }

    /// Frees the address of `key`, if any.
    pub fn release(&mut self, key: &str) -> Option<IpAddr> {
        let ip = self.by_key.remove(key)?;
        self.by_ip.remove(&to_u128(ip));
        Some(ip)
    }

    /// The address held by `key`.
    pub fn get(&self, key: &str) -> Option<IpAddr> {
        self.by_key.get(key).copied()
    }

    /// Whether `ip` is in the pool.
    pub fn in_pool(&self, ip: IpAddr) -> bool {
        self.pool.contains(ip)
    }

    /// Number of assigned addresses.
    pub fn assigned(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pool_parsing_cases() {
        let cases = [
            (
                "cidr skips network and broadcast",
                "10.0.0.0/30",
                Some(("10.0.0.1", "10.0.0.2")),
            ),
            (
                "inclusive range",
                "10.0.0.5-10.0.0.7",
                Some(("10.0.0.5", "10.0.0.7")),
            ),
            ("single /32", "10.0.0.9/32", Some(("10.0.0.9", "10.0.0.9"))),
            (
                "ipv6 range",
                "fd00::1-fd00::3",
                Some(("fd00::1", "fd00::3")),
            ),
            ("reversed range", "10.0.0.7-10.0.0.5", None),
            ("mixed families", "10.0.0.1-fd00::1", None),
            ("garbage", "pool", None),
        ];
        for (name, spec, want) in cases {
            let got = spec.parse::<Pool>();
            match want {
                Some((a, b)) => {
                    let p = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(p.contains(ip(a)) && p.contains(ip(b)), "{name}");
                    assert_eq!(p.size(), to_u128(ip(b)) - to_u128(ip(a)) + 1, "{name}");
                }
                None => assert!(got.is_err(), "{name}"),
            }
        }
        let err = "10.0.0.7-10.0.0.5".parse::<Pool>().unwrap_err().to_string();
        assert!(
            err.contains("10.0.0.7-10.0.0.5") && err.contains("after"),
            "{err}"
        );
    }

    #[test]
    fn allocation_is_unique_stable_and_released() {
        let mut a = Allocator::new("10.0.0.1-10.0.0.3".parse().unwrap());
        let x = a.ensure("ns/x", None).unwrap();
        assert_eq!(
            a.ensure("ns/x", None).unwrap(),
            x,
            "stable for the same service"
        );
        let y = a.ensure("ns/y", None).unwrap();
        let z = a.ensure("ns/z", None).unwrap();
        assert!(x != y && y != z && x != z);
        assert!(a
            .ensure("ns/w", None)
            .unwrap_err()
            .to_string()
            .contains("exhausted"));
        assert_eq!(a.release("ns/y"), Some(y));
        assert_eq!(
            a.ensure("ns/w", None).unwrap(),
            y,
            "a released address is reused"
        );
    }

    #[test]
    fn preferred_and_rebuilt_addresses_are_honoured_without_duplicates() {
        let mut a = Allocator::new("10.0.0.0/24".parse().unwrap());
        assert!(a.claim("ns/a", ip("10.0.0.50")), "rebuild from status");
        assert!(
            !a.claim("ns/b", ip("10.0.0.50")),
            "a second claim on the same address is refused"
        );
        assert!(!a.claim("ns/c", ip("192.168.0.1")), "outside the pool");
        assert_eq!(
            a.ensure("ns/b", Some(ip("10.0.0.50"))).unwrap(),
            ip("10.0.0.1"),
            "taken preferred address falls back"
        );
        assert_eq!(
            a.ensure("ns/c", Some(ip("10.0.0.77"))).unwrap(),
            ip("10.0.0.77")
        );
        assert_eq!(a.assigned(), 3);
    }
}
