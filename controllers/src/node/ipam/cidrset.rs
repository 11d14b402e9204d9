//! One cluster CIDR cut into node CIDRs of one size, and which of them are taken
//! (`pkg/controller/nodeipam/ipam/cidrset`'s `CidrSet`): the next free one is found from where the
//! last allocation stopped, going round, as upstream's `AllocateNext`, so two allocators fed the
//! same adds, occupies and releases hand out the same CIDRs in the same order.
//!
//! Owns no API call: the range allocator ([`super`]) decides what to allocate, occupy and release.

use std::net::IpAddr;

use ipnet::IpNet;

/// IPv6 node CIDRs may be at most this many bits longer than the cluster CIDR (upstream's
/// `clusterSubnetMaxDiff`: 65,536 node CIDRs).
pub const CLUSTER_SUBNET_MAX_DIFF: u8 = 16;

/// Why a set cannot be made or a CIDR cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrSetError {
    /// `ErrCIDRRangeNoCIDRsRemaining`.
    #[error("CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range")]
    Full,
    /// `ErrCIDRSetSubNetTooBig`.
    #[error("New CIDR set failed; the node CIDR size is too big")]
    SubNetTooBig,
    /// A node mask shorter than the cluster CIDR's (upstream would shift by a negative count).
    #[error("node CIDR mask size /{node} is shorter than the cluster CIDR {cluster}")]
    SubNetLargerThanCluster { cluster: IpNet, node: u8 },
    /// A CIDR not overlapping the cluster CIDR.
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange { cidr: IpNet, cluster: IpNet },
    /// A CIDR of the other family.
    #[error("cidr {cidr} is not of the family of cluster cidr {cluster}")]
    OtherFamily { cidr: IpNet, cluster: IpNet },
}

/// The set (`CidrSet`).
#[derive(Debug, Clone)]
pub struct CidrSet {
    cluster: IpNet,
    /// The cluster CIDR's first address as a number (an IPv4 one in the low 32 bits).
    base: u128,
    /// Address bits: 32 or 128.
    bits: u8,
    node_mask: u8,
    max: usize,
    allocated: usize,
    next_candidate: usize,
    used: Vec<u64>,
}

fn addr_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

impl CidrSet {
    /// `NewCIDRSet`: `cluster` cut into `/node_mask` CIDRs.
    pub fn new(cluster: IpNet, node_mask: u8) -> Result<CidrSet, CidrSetError> {
        let cluster = cluster.trunc();
        let cluster_mask = cluster.prefix_len();
        let bits = cluster.max_prefix_len();
        if node_mask < cluster_mask || node_mask > bits {
            return Err(CidrSetError::SubNetLargerThanCluster {
                cluster,
                node: node_mask,
            });
        }
        let diff = node_mask - cluster_mask;
        if matches!(cluster, IpNet::V6(_)) && diff > CLUSTER_SUBNET_MAX_DIFF {
            return Err(CidrSetError::SubNetTooBig);
        }
        // IPv4 allows up to 32 bits of difference; 2^32 bits of bitmap would be 512 MiB, as
        // upstream's big.Int would be: kept, as its limit.
        let max = 1usize << diff;
        Ok(CidrSet {
            cluster,
            base: addr_bits(cluster.network()),
            bits,
            node_mask,
            max,
            allocated: 0,
            next_candidate: 0,
            used: vec![0; max.div_ceil(64)],
        })
    }

    /// The cluster CIDR (the metrics' label).
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// How many node CIDRs the set holds.
    pub fn max_cidrs(&self) -> usize {
        self.max
    }

    /// How many are taken.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    fn is_used(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set_used(&mut self, i: usize, on: bool) {
        if on {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }

    /// `indexToCIDRBlock`.
    fn cidr_at(&self, index: usize) -> IpNet {
        let shift = u32::from(self.bits - self.node_mask);
        let ip = self.base | (index as u128).checked_shl(shift).unwrap_or(0);
        let addr = if self.bits == 32 {
            IpAddr::V4((ip as u32).into())
        } else {
            IpAddr::V6(ip.into())
        };
        IpNet::new(addr, self.node_mask).expect("mask within the family")
    }

    /// `AllocateNext`: the first free CIDR from the candidate after the last one allocated, and
    /// how many taken ones were passed over (the tries metric).
    pub fn allocate_next(&mut self) -> Result<(IpNet, usize), CidrSetError> {
        if self.allocated == self.max {
            return Err(CidrSetError::Full);
        }
        let mut candidate = self.next_candidate;
        let mut tries = 0;
        while tries < self.max && self.is_used(candidate) {
            candidate = (candidate + 1) % self.max;
            tries += 1;
        }
        self.next_candidate = (candidate + 1) % self.max;
        self.set_used(candidate, true);
        self.allocated += 1;
        Ok((self.cidr_at(candidate), tries))
    }

    /// `getIndexForIP`.
    fn index_for(&self, ip: u128) -> Result<usize, ()> {
        let shift = u32::from(self.bits - self.node_mask);
        let index = (self.base ^ ip).checked_shr(shift).unwrap_or(0);
        if index >= self.max as u128 {
            return Err(());
        }
        Ok(index as usize)
    }

    /// `getBeginningAndEndIndices`: the node CIDRs `cidr` covers (all of them when it holds the
    /// cluster CIDR).
    fn range_of(&self, cidr: IpNet) -> Result<(usize, usize), CidrSetError> {
        let out = || CidrSetError::OutOfRange {
            cidr,
            cluster: self.cluster,
        };
        if cidr.max_prefix_len() != self.bits {
            return Err(CidrSetError::OtherFamily {
                cidr,
                cluster: self.cluster,
            });
        }
        let overlaps = self.cluster.contains(&cidr.network()) || cidr.contains(&self.cluster);
        if !overlaps {
            return Err(out());
        }
        if self.cluster.prefix_len() >= cidr.prefix_len() {
            return Ok((0, self.max - 1));
        }
        let node_mask_bits = |ip: u128| -> u128 {
            let host = u32::from(self.bits - self.node_mask);
            ip & !(u128::MAX.checked_shr(128 - host).unwrap_or(0))
        };
        let first = addr_bits(cidr.network());
        let last = addr_bits(cidr.broadcast());
        let begin = self.index_for(node_mask_bits(first)).map_err(|_| out())?;
        let end = self.index_for(node_mask_bits(last)).map_err(|_| out())?;
        Ok((begin, end))
    }

    /// `Occupy`: every node CIDR `cidr` covers is taken; returns how many were newly taken.
    pub fn occupy(&mut self, cidr: IpNet) -> Result<usize, CidrSetError> {
        let (begin, end) = self.range_of(cidr)?;
        let mut n = 0;
        for i in begin..=end {
            if !self.is_used(i) {
                self.set_used(i, true);
                self.allocated += 1;
                n += 1;
            }
        }
        Ok(n)
    }

    /// `Release`: every node CIDR `cidr` covers is free again; returns how many were freed.
    pub fn release(&mut self, cidr: IpNet) -> Result<usize, CidrSetError> {
        let (begin, end) = self.range_of(cidr)?;
        let mut n = 0;
        for i in begin..=end {
            if self.is_used(i) {
                self.set_used(i, false);
                self.allocated -= 1;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn all(set: &mut CidrSet) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok((c, _)) = set.allocate_next() {
            out.push(c.to_string());
        }
        out
    }

    /// Upstream's `TestCIDRSetFullyAllocated` and `TestIndexToCIDRBlock` cases.
    #[test]
    fn allocates_in_order_then_reports_full() {
        let mut s = CidrSet::new(net("127.123.234.0/30"), 30).unwrap();
        assert_eq!(s.allocate_next().unwrap().0, net("127.123.234.0/30"));
        assert_eq!(s.allocate_next(), Err(CidrSetError::Full));
        s.release(net("127.123.234.0/30")).unwrap();
        assert_eq!(s.allocate_next().unwrap().0, net("127.123.234.0/30"));

        let mut s = CidrSet::new(net("10.244.0.0/22"), 24).unwrap();
        assert_eq!(
            all(&mut s),
            [
                "10.244.0.0/24",
                "10.244.1.0/24",
                "10.244.2.0/24",
                "10.244.3.0/24"
            ]
        );
        let s = CidrSet::new(net("2001:db8::/32"), 48).unwrap();
        assert_eq!(s.cidr_at(255), net("2001:db8:ff::/48"));
        let s = CidrSet::new(net("2001:db8:1234:ff00::/56"), 72).unwrap();
        assert_eq!(s.cidr_at(0xffff), net("2001:db8:1234:ffff:ff00::/72"));
        let s = CidrSet::new(net("fd00:10:244::/56"), 64).unwrap();
        assert_eq!(s.cidr_at(3), net("fd00:10:244:3::/64"));
    }

    /// The next candidate goes round from the last allocation, not from the first free one.
    #[test]
    fn the_next_candidate_follows_the_last_allocation() {
        let mut s = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        let a = s.allocate_next().unwrap().0;
        let _b = s.allocate_next().unwrap().0;
        s.release(a).unwrap();
        assert_eq!(s.allocate_next().unwrap().0, net("10.0.2.0/24"));
        assert_eq!(s.allocate_next().unwrap().0, net("10.0.3.0/24"));
        let (c, tries) = s.allocate_next().unwrap();
        assert_eq!((c, tries), (net("10.0.0.0/24"), 0));
        assert_eq!(s.allocate_next(), Err(CidrSetError::Full));
    }

    /// `TestOccupy`: a CIDR larger than the node size takes every node CIDR it covers; one
    /// holding the cluster CIDR takes them all.
    #[test]
    fn occupy_covers_ranges() {
        let mut s = CidrSet::new(net("10.244.0.0/16"), 24).unwrap();
        assert_eq!(s.occupy(net("10.244.4.0/22")).unwrap(), 4);
        assert_eq!(s.occupy(net("10.244.5.0/24")).unwrap(), 0, "taken already");
        assert_eq!(s.allocated(), 4);
        let mut s = CidrSet::new(net("10.244.0.0/16"), 24).unwrap();
        assert_eq!(s.occupy(net("10.0.0.0/8")).unwrap(), 256);
        assert_eq!(s.allocate_next(), Err(CidrSetError::Full));
        let mut s = CidrSet::new(net("10.244.0.0/16"), 24).unwrap();
        assert!(matches!(
            s.occupy(net("10.96.0.0/16")),
            Err(CidrSetError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.occupy(net("fd00::/64")),
            Err(CidrSetError::OtherFamily { .. })
        ));
        // A CIDR smaller than a node CIDR takes the one holding it.
        assert_eq!(s.occupy(net("10.244.7.128/25")).unwrap(), 1);
        assert_eq!(s.release(net("10.244.7.0/24")).unwrap(), 1);
    }

    #[test]
    fn sizes_are_checked_as_upstream() {
        assert_eq!(
            CidrSet::new(net("fd00::/48"), 65).unwrap_err(),
            CidrSetError::SubNetTooBig
        );
        assert!(CidrSet::new(net("fd00::/48"), 64).is_ok());
        assert!(
            CidrSet::new(net("10.0.0.0/8"), 28).is_ok(),
            "IPv4: no limit"
        );
        assert!(matches!(
            CidrSet::new(net("10.0.0.0/16"), 8),
            Err(CidrSetError::SubNetLargerThanCluster { .. })
        ));
        assert_eq!(
            CidrSet::new(net("10.0.0.0/16"), 24).unwrap().max_cidrs(),
            256
        );
    }
}
