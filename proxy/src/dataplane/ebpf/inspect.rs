//! Reading what the eBPF dataplane holds, straight from the pinned maps (no agent needed): the
//! frontends with their backend sets, per-backend connection counters, round-robin cursors and
//! session-affinity entries (`proxy inspect --maps`, `proxy trace`), what is pinned (the restart
//! log line), and which programs are attached to a cgroup (`BPF_PROG_QUERY`).
//!
//! Owns only reading: nothing here writes a map.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use aya::maps::{Array, Map, MapData};
use ipnet::IpNet;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, BackendCounters, NodeConfig, NodeConfig6, ServiceKey,
    ServiceValue, SlotKey, CLIENT_ADDR, SCOPE_EXTERNAL, SVC_F_VIP,
};

use super::compile::{addr_from_words, addr_words, key_is_v6, BackendAddr};
use super::maps::{
    Ranges, Table, AFFINITY, BACKENDS, CONFIG, CONFIG6, COUNTERS, RR, SERVICES, SLOTS, SRC_RANGES,
};
use super::programmed::backend_addr;
use crate::error::DataplaneError;
use crate::model::Protocol;

/// One backend slot of a set, with its live counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    pub slot: u32,
    pub backend_id: u32,
    /// None when the backend entry is missing or unreadable.
    pub addr: Option<BackendAddr>,
    pub active: u64,
    pub total: u64,
}

/// Who an affinity entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityClient {
    /// Socket path: the client's network namespace cookie.
    Netns(u64),
    /// tc path: the client's source address.
    Addr(IpAddr),
}

/// One session-affinity entry of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityView {
    pub client: AffinityClient,
    pub backend_id: u32,
    /// Nanoseconds since the client last used it (CLOCK_MONOTONIC, as the programs see time).
    pub idle_ns: u64,
}

/// One frontend (service address, port, protocol, scope) and its backend set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendView {
    pub addr: IpAddr,
    pub port: u16,
    /// None for an unknown protocol number.
    pub proto: Option<Protocol>,
    /// Tc path (traffic from outside the node) instead of the socket path.
    pub external: bool,
    pub value: ServiceValue,
    pub slots: Vec<SlotView>,
    /// The set's round-robin cursor (the next connection starts at `cursor % count`).
    pub cursor: Option<u32>,
    pub affinity: Vec<AffinityView>,
    /// Sources loadBalancerSourceRanges admit (tc frontends with `SVC_F_SOURCE_RANGES`).
    pub source_ranges: Vec<IpNet>,
}

impl FrontendView {
    /// `round-robin`, `least-conn` or `maglev`.
    pub fn algorithm(&self) -> &'static str {
        match self.value.algorithm {
            proxy_common::ALG_LEAST_CONN => "least-conn",
            proxy_common::ALG_MAGLEV => "maglev",
            _ => "round-robin",
        }
    }

    pub fn is_maglev(&self) -> bool {
        self.value.algorithm == proxy_common::ALG_MAGLEV
    }

    /// A Maglev set's table summarised: each backend (its first slot's view) with the number of
    /// slots it holds, in backend id order.
    pub fn maglev_counts(&self) -> Vec<(&SlotView, u32)> {
        let mut by_id: BTreeMap<u32, (&SlotView, u32)> = BTreeMap::new();
        for s in &self.slots {
            by_id.entry(s.backend_id).or_insert((s, 0)).1 += 1;
        }
        by_id.into_values().collect()
    }

    /// `ADDR:PORT/PROTO` (`[ADDR]:PORT/PROTO` in IPv6).
    pub fn frontend(&self) -> String {
        let proto = self.proto.map(Protocol::as_str).unwrap_or("?");
        format!(
            "{}/{proto}",
            std::net::SocketAddr::new(self.addr, self.port)
        )
    }
}

/// Everything the maps say, read at one moment.
#[derive(Debug, Clone, Default)]
pub struct MapSnapshot {
    /// Frontends, by (external, address, port, protocol number).
    pub frontends: Vec<FrontendView>,
    /// Addresses that are clusterIPs (other ports of them are refused).
    pub vips: Vec<IpAddr>,
    /// The node-wide settings (service range) when the config map is readable.
    pub config: Option<NodeConfig>,
    /// The IPv6 settings, when an agent that serves IPv6 wrote them.
    pub config6: Option<NodeConfig6>,
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is valid for writes for the call; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The maps directory under a `--bpffs-path`.
pub fn maps_dir(bpffs_path: &Path) -> PathBuf {
    bpffs_path.join("maps")
}

impl MapSnapshot {
    /// Reads the maps pinned under `bpffs_path` (the agent's `--bpffs-path`).
    pub fn read(bpffs_path: &Path) -> Result<MapSnapshot, DataplaneError> {
        let dir = maps_dir(bpffs_path);
        if !dir.join(SERVICES).exists() {
            return Err(DataplaneError::Other(format!(
                "--bpffs-path {}: no pinned {SERVICES} (is the ebpf backend running, or did it \
                 run, with this --bpffs-path?)",
                bpffs_path.display()
            )));
        }
        let services: Table<ServiceKey, ServiceValue> = Table::from_pin(&dir, SERVICES)?;
        let slots: Table<SlotKey, u32> = Table::from_pin(&dir, SLOTS)?;
        let backends: BTreeMap<u32, Backend> = Table::from_pin(&dir, BACKENDS)?
            .entries()?
            .into_iter()
            .collect();
        let counters: BTreeMap<u32, BackendCounters> =
            Table::<u32, BackendCounters>::from_pin(&dir, COUNTERS)?
                .entries()?
                .into_iter()
                .collect();
        let rr: BTreeMap<u32, u32> = Table::<u32, u32>::from_pin(&dir, RR)?
            .entries()?
            .into_iter()
            .collect();
        let affinity = Table::<AffinityKey, AffinityValue>::from_pin(&dir, AFFINITY)?.entries()?;
        let mut sets: BTreeMap<u32, Vec<(u32, u32)>> = BTreeMap::new();
        for (k, id) in slots.entries()? {
            sets.entry(k.set_id).or_default().push((k.slot, id));
        }
        let ranges = read_ranges(&dir)?;
        let now = monotonic_ns();
        let mut snap = MapSnapshot {
            config: read_config(&dir, CONFIG),
            config6: read_config(&dir, CONFIG6),
            ..MapSnapshot::default()
        };
        for (k, v) in services.entries()? {
            let v6 = key_is_v6(&k);
            if v.flags & SVC_F_VIP != 0 {
                snap.vips.push(addr_from_words(k.addr, v6));
                continue;
            }
            let mut set = sets.get(&v.set_id).cloned().unwrap_or_default();
            set.sort_unstable();
            let slots = set
                .into_iter()
                .map(|(slot, id)| slot_view(slot, id, &backends, &counters))
                .collect();
            let affinity = affinity
                .iter()
                .filter(|(ak, _)| ak.set_id == v.set_id)
                .map(|(ak, av)| affinity_view(ak, av, v6, now))
                .collect();
            snap.frontends.push(FrontendView {
                addr: addr_from_words(k.addr, v6),
                port: u16::from_be(k.port),
                proto: protocol(k.proto),
                external: k.scope & SCOPE_EXTERNAL != 0,
                value: v,
                slots,
                cursor: rr.get(&v.set_id).copied(),
                affinity,
                source_ranges: ranges.get(&k).cloned().unwrap_or_default(),
            });
        }
        snap.frontends
            .sort_by_key(|f| (f.external, f.addr, f.port, f.value.set_id));
        snap.vips.sort_unstable();
        Ok(snap)
    }

    /// The frontend for a destination, in the socket path or the tc path.
    pub fn frontend(
        &self,
        addr: IpAddr,
        port: u16,
        proto: Protocol,
        external: bool,
    ) -> Option<&FrontendView> {
        self.frontends.iter().find(|f| {
            f.addr == addr && f.port == port && f.proto == Some(proto) && f.external == external
        })
    }

    /// Whether a socket in the network namespace `cookie` is the node itself (as `sock.rs`
    /// decides for loadBalancerSourceRanges).
    pub fn is_node_netns(&self, cookie: Option<u64>) -> bool {
        match (self.config, cookie) {
            (Some(c), Some(cookie)) => c.host_netns != 0 && c.host_netns == cookie,
            _ => false,
        }
    }

    /// Whether `addr` is inside `--service-cluster-ip-range` as the programs see it.
    pub fn in_service_range(&self, addr: IpAddr) -> bool {
        let w = addr_words(addr);
        match addr {
            IpAddr::V4(_) => self
                .config
                .is_some_and(|c| c.svc_mask != 0 && w[0] & c.svc_mask == c.svc_net),
            IpAddr::V6(_) => self.config6.is_some_and(|c| {
                c.svc_mask != [0; 4] && (0..4).all(|i| w[i] & c.svc_mask[i] == c.svc_net[i])
            }),
        }
    }
}

/// The allowed sources of every guarded tc frontend (none when an older agent's maps lack the
/// trie).
fn read_ranges(dir: &Path) -> Result<HashMap<ServiceKey, Vec<IpNet>>, DataplaneError> {
    let mut out: HashMap<ServiceKey, Vec<IpNet>> = HashMap::new();
    if !dir.join(SRC_RANGES).exists() {
        return Ok(out);
    }
    for key in Ranges::from_pin(dir)?.keys()? {
        let data = key.data();
        let prefix = key
            .prefix_len()
            .saturating_sub(proxy_common::SRC_RANGE_FRONTEND_BITS);
        let v6 = key_is_v6(&data.frontend);
        let max = if v6 { 128 } else { 32 };
        let net = IpNet::new(addr_from_words(data.src, v6), prefix.min(max) as u8)
            .expect("prefix clamped to the family's length");
        out.entry(data.frontend).or_default().push(net);
    }
    for nets in out.values_mut() {
        nets.sort_unstable();
    }
    Ok(out)
}

fn read_config<T: aya::Pod>(dir: &Path, name: &str) -> Option<T> {
    let data = MapData::from_pin(dir.join(name)).ok()?;
    let arr: Array<MapData, T> = Array::try_from(Map::Array(data)).ok()?;
    arr.get(&0, 0).ok()
}

fn protocol(n: u8) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn slot_view(
    slot: u32,
    id: u32,
    backends: &BTreeMap<u32, Backend>,
    counters: &BTreeMap<u32, BackendCounters>,
) -> SlotView {
    let c = counters.get(&id).copied().unwrap_or_default();
    SlotView {
        slot,
        backend_id: id,
        addr: backends.get(&id).and_then(backend_addr),
        active: c.active,
        total: c.total,
    }
}

/// An affinity entry of a set of the family `v6` says.
fn affinity_view(k: &AffinityKey, v: &AffinityValue, v6: bool, now: u64) -> AffinityView {
    let client = if k.kind == CLIENT_ADDR {
        AffinityClient::Addr(addr_from_words(k.client, v6))
    } else {
        AffinityClient::Netns(u64::from(k.client[0]) | (u64::from(k.client[1]) << 32))
    };
    AffinityView {
        client,
        backend_id: v.backend_id,
        idle_ns: now.saturating_sub(v.last_used_ns),
    }
}

/// What is pinned under a `--bpffs-path`: (maps, links). Zero and zero on a first start.
pub fn pinned(bpffs_path: &Path) -> (usize, usize) {
    let count = |d: PathBuf| std::fs::read_dir(d).map(|e| e.count()).unwrap_or(0);
    (count(maps_dir(bpffs_path)), count(bpffs_path.join("links")))
}

/// The cgroup attach points the socket programs use, with their `bpf_attach_type` numbers.
pub const CGROUP_ATTACH_POINTS: [(&str, u32); 9] = [
    ("connect4", 10),
    ("sendmsg4", 14),
    ("recvmsg4", 19),
    ("getpeername4", 29),
    ("connect6", 11),
    ("sendmsg6", 15),
    ("recvmsg6", 20),
    ("getpeername6", 30),
    ("sock_release", 34),
];

/// `union bpf_attr` as `BPF_PROG_QUERY` reads it.
#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

const BPF_PROG_QUERY: libc::c_long = 16;

/// How many programs are attached to `cgroup` (directly, not inherited) at each of
/// [`CGROUP_ATTACH_POINTS`].
pub fn cgroup_programs(cgroup: &Path) -> Result<Vec<(&'static str, u32)>, DataplaneError> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(cgroup)
        .map_err(|e| DataplaneError::io(format!("opening cgroup {}", cgroup.display()), e))?;
    let mut out = Vec::new();
    for (name, attach_type) in CGROUP_ATTACH_POINTS {
        let mut attr = ProgQueryAttr {
            target_fd: dir.as_raw_fd() as u32,
            attach_type,
            ..ProgQueryAttr::default()
        };
        // SAFETY: BPF_PROG_QUERY reads and writes `attr`, which lives for the call, and writes no
        // program ids (prog_ids is null, prog_cnt 0: it only reports the count).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut ProgQueryAttr,
                std::mem::size_of::<ProgQueryAttr>() as u32,
            )
        };
        if rc < 0 {
            return Err(DataplaneError::io(
                format!("BPF_PROG_QUERY {name} on cgroup {}", cgroup.display()),
                std::io::Error::last_os_error(),
            ));
        }
        out.push((name, attr.prog_cnt));
    }
    Ok(out)
}
