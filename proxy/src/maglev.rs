//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
//! Load Balancer", NSDI 2016), built the way Cilium's `pkg/maglev` builds it: one lookup table
//! per endpoint set, filled from each endpoint's permutation of the slots.
//!
//! Owns [`TableSize`] (the `--maglev-table-size` flag: a prime), [`MaglevTable`] (one endpoint
//! set of one family), [`MaglevTables`] (a selection's tables) and [`flow_hash`]. Uses `model`
//! only; `selection` keeps the tables with the endpoint sets, `state` builds them once per
//! change of a Maglev Service port, and every backend renders the same table: the eBPF maps
//! hold it slot by slot, nftables as a map of slots, iptables as rules on the packet mark, the
//! userspace backend looks it up. The flow hash is `proxy_common::hash` (the kernel's jhash, as
//! nftables' `jhash` computes it), except on iptables, whose HMARK target has its own
//! ([`hmark_hash`]).
//!
//! The table is a function of the endpoints' stable identities (`IP:port`) and the size only:
//! every node with the same endpoints and `--maglev-table-size` builds the same table, so a flow
//! picks the same endpoint whichever node it enters. Each endpoint gets `M / N` slots rounded
//! down or up (the fill takes turns), and removing one endpoint moves its own slots and few
//! others.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use proxy_common::hash::{
    flow_hash_v4, flow_hash_v6, jhash_bytes, jhash_words, slot_of, OFFSET_SEED, SKIP_SEED,
};
use serde::{Deserialize, Serialize};

use crate::model::{Endpoint, IpFamily};

/// The default table size, Cilium's and upstream Maglev's: a prime well above 100 x the
/// endpoints of a typical Service.
pub const DEFAULT_TABLE_SIZE: u32 = 16381;

/// The largest table size accepted (Cilium's largest, 131071 = 2^17 - 1): a table is built per
/// endpoint set and each slot is a map element on the eBPF and nftables backends.
pub const MAX_TABLE_SIZE: u32 = 131_071;

/// The number of slots of every Maglev table on this node (`--maglev-table-size`). Prime, as
/// Maglev requires: each endpoint's skip then walks every slot, so the fill always ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableSize(u32);

impl Default for TableSize {
    fn default() -> Self {
        TableSize(DEFAULT_TABLE_SIZE)
    }
}

impl TableSize {
    /// A table size, or why `n` cannot be one.
    pub fn new(n: u32) -> Result<TableSize, String> {
        if !(3..=MAX_TABLE_SIZE).contains(&n) {
            return Err(format!(
                "--maglev-table-size {n}: must be a prime between 3 and {MAX_TABLE_SIZE} \
                 (default {DEFAULT_TABLE_SIZE}; more than 100 x a Service's endpoints is recommended)"
            ));
        }
        if !is_prime(n) {
            return Err(format!(
                "--maglev-table-size {n}: is not a prime; Maglev needs a prime table size \
                 (e.g. 251, 509, 1021, 2039, 4093, 8191, {DEFAULT_TABLE_SIZE}, 32749, 65521, {MAX_TABLE_SIZE})"
            ));
        }
        Ok(TableSize(n))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl std::str::FromStr for TableSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let n: u32 = s
            .trim()
            .parse()
            .map_err(|_| format!("--maglev-table-size {s:?}: not a number"))?;
        TableSize::new(n)
    }
}

fn is_prime(n: u32) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// One endpoint set of one family as a Maglev lookup table: slot -> endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaglevTable {
    size: u32,
    /// The endpoints in their stable order (sorted by address).
    endpoints: Box<[SocketAddr]>,
    /// Per slot, an index into `endpoints`; empty when there are no endpoints.
    slots: Box<[u32]>,
}

impl MaglevTable {
    /// Builds the table of `endpoints` (duplicates ignored) with `size` slots.
    pub fn new(endpoints: impl IntoIterator<Item = SocketAddr>, size: TableSize) -> Self {
        let mut eps: Vec<SocketAddr> = endpoints.into_iter().collect();
        eps.sort();
        eps.dedup();
        let m = size.get();
        let n = eps.len();
        if n == 0 {
            return MaglevTable {
                size: m,
                endpoints: Box::new([]),
                slots: Box::new([]),
            };
        }
        // Each endpoint's permutation of the slots: offset + j * skip (mod M), both from hashes
        // of its name, so they depend on nothing but the endpoint.
        let perm: Vec<(u64, u64)> = eps
            .iter()
            .map(|e| {
                let name = e.to_string();
                let offset = jhash_bytes(name.as_bytes(), OFFSET_SEED) % m;
                let skip = jhash_bytes(name.as_bytes(), SKIP_SEED) % (m - 1) + 1;
                (u64::from(offset), u64::from(skip))
            })
            .collect();
        let mut next = vec![0u64; n];
        let mut slots = vec![u32::MAX; m as usize];
        let mut filled = 0u32;
        // Endpoints take turns: each takes the next free slot of its own permutation. A prime M
        // makes every permutation visit every slot, so each turn finds one.
        'fill: loop {
            for (i, &(offset, skip)) in perm.iter().enumerate() {
                let mut c = (offset + next[i] * skip) % u64::from(m);
                while slots[c as usize] != u32::MAX {
                    next[i] += 1;
                    c = (offset + next[i] * skip) % u64::from(m);
                }
                slots[c as usize] = i as u32;
                next[i] += 1;
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
        }
        MaglevTable {
            size: m,
            endpoints: eps.into(),
            slots: slots.into(),
        }
    }

    /// The number of slots (the node's table size).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The endpoints, in the table's order.
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint of slot `slot`.
    pub fn at(&self, slot: u32) -> Option<SocketAddr> {
        let i = *self.slots.get(slot as usize)?;
        Some(self.endpoints[i as usize])
    }

    /// Every slot's endpoint, in slot order (empty without endpoints).
    pub fn slots(&self) -> impl ExactSizeIterator<Item = SocketAddr> + '_ {
        self.slots.iter().map(|i| self.endpoints[*i as usize])
    }

    /// Every slot's endpoint as an index into [`MaglevTable::endpoints`], in slot order.
    pub fn slot_indices(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.slots.iter().map(|i| *i as usize)
    }

    /// The slot a flow hash falls in.
    pub fn slot_of(&self, hash: u32) -> u32 {
        slot_of(hash, self.size)
    }

    /// The endpoint of a flow from `src` to `dst` (the Service address it was sent to).
    pub fn pick(&self, src: SocketAddr, dst: SocketAddr) -> Option<SocketAddr> {
        self.at(self.slot_of(flow_hash(src, dst)))
    }

    /// How many slots each endpoint holds, in the table's endpoint order.
    pub fn slot_counts(&self) -> Vec<(SocketAddr, u32)> {
        let mut counts = vec![0u32; self.endpoints.len()];
        for i in self.slots.iter() {
            counts[*i as usize] += 1;
        }
        self.endpoints.iter().copied().zip(counts).collect()
    }
}

/// The flow hash of a connection from `src` to `dst`, as every backend computes it
/// (`proxy_common::hash`). A flow mixing families hashes as IPv6 (v4-mapped).
pub fn flow_hash(src: SocketAddr, dst: SocketAddr) -> u32 {
    let (sport, dport) = (src.port().to_be(), dst.port().to_be());
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => flow_hash_v4(
            u32::from_ne_bytes(s.octets()),
            u32::from_ne_bytes(d.octets()),
            sport,
            dport,
        ),
        (s, d) => flow_hash_v6(&v6_words(s), &v6_words(d), sport, dport),
    }
}

/// The largest table the iptables backend renders: it carries a flow's slot in the low 14 bits
/// of the packet mark, below the masquerade bit (0x4000), so a slot must stay under 16384.
pub const IPTABLES_MAX_TABLE_SIZE: u32 = 16381;

/// The seed (`--hmark-rnd`) of the iptables backend's HMARK rules: fixed, so that every node
/// hashes a flow alike.
pub const HMARK_RND: u32 = proxy_common::hash::FLOW_SEED;

/// The hash the kernel's `HMARK` target (`net/netfilter/xt_HMARK.c`) computes for a packet from
/// `src` to `dst` of IP protocol `proto` with `--hmark-tuple src,dst,sport,dport,proto
/// --hmark-rnd rnd` (the backend's rules use [`HMARK_RND`]), before it scales the hash into `--hmark-mod` slots (as
/// [`MaglevTable::slot_of`] does). The iptables backend's Maglev slot, so that `proxy trace`
/// and the tests know which slot a flow takes there. HMARK's hash is symmetric (it orders the
/// two addresses and the two ports), and differs from [`flow_hash`]: the iptables backend puts
/// a flow in a different slot than the other backends do, the same on every iptables node.
pub fn hmark_hash(src: SocketAddr, dst: SocketAddr, proto: u8, rnd: u32) -> u32 {
    // An IPv6 address is folded into one word (its four words XORed), as HMARK does.
    let fold = |ip: IpAddr| match ip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => a
            .octets()
            .chunks_exact(4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0, |x, w| x ^ w),
    };
    let (s, d) = (fold(src.ip()), fold(dst.ip()));
    let (ps, pd) = (src.port(), dst.port());
    let ports = (u32::from(ps.max(pd)) << 16) | u32::from(ps.min(pd));
    // `jhash_3words(a, b, c, rnd)` is lookup3 over three words, which `jhash_words` computes.
    jhash_words(&[s.min(d), s.max(d), ports], rnd) ^ u32::from(proto)
}

fn v6_words(ip: IpAddr) -> [u32; 4] {
    let o = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// One endpoint set's tables, per family (a connection never changes family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyTables {
    pub v4: Arc<MaglevTable>,
    pub v6: Arc<MaglevTable>,
}

impl FamilyTables {
    /// The tables of `endpoints`.
    pub fn new(endpoints: &[Endpoint], size: TableSize) -> Self {
        let of = |f: IpFamily| {
            Arc::new(MaglevTable::new(
                endpoints
                    .iter()
                    .filter(|e| IpFamily::of(&e.addr) == f)
                    .map(Endpoint::socket_addr),
                size,
            ))
        };
        FamilyTables {
            v4: of(IpFamily::V4),
            v6: of(IpFamily::V6),
        }
    }

    /// The table of `family`.
    pub fn of(&self, family: IpFamily) -> &Arc<MaglevTable> {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }
}

/// The Maglev tables of a Maglev Service port's selection: one per endpoint set (cluster and
/// external, shared when the sets are equal) and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaglevTables {
    pub cluster: Arc<FamilyTables>,
    pub external: Arc<FamilyTables>,
}

impl MaglevTables {
    /// The tables of the cluster and external endpoint sets.
    pub fn new(cluster: &[Endpoint], external: &[Endpoint], size: TableSize) -> Self {
        let cluster_tables = Arc::new(FamilyTables::new(cluster, size));
        let external_tables = if cluster == external {
            cluster_tables.clone()
        } else {
            Arc::new(FamilyTables::new(external, size))
        };
        MaglevTables {
            cluster: cluster_tables,
            external: external_tables,
        }
    }
}

#[cfg(test)]
mod tests;
