//! The maps of the eBPF object. Sizes here are defaults; the agent sets the real sizes at load time
//! (`EbpfLoader::set_max_entries`) and every map is pinned by name under the agent's bpffs path, so
//! a restarted agent finds the same maps.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray},
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, BackendCounters, CtKey, CtValue, DsrFrontend, NodeConfig,
    NodeConfig6, RevNatKey, RevNatValue, ServiceKey, ServiceValue, SlotKey, SockBackend,
    SrcRangeKey, DSR_STATS, TERM_STATS, XDP_STATS,
};

#[map]
pub static KPR_SERVICES: HashMap<ServiceKey, ServiceValue> =
    HashMap::pinned(262_144, BPF_F_NO_PREALLOC);

#[map]
pub static KPR_SLOTS: HashMap<SlotKey, u32> = HashMap::pinned(1_048_576, BPF_F_NO_PREALLOC);

#[map]
pub static KPR_BACKENDS: HashMap<u32, Backend> = HashMap::pinned(1_048_576, BPF_F_NO_PREALLOC);

#[map]
pub static KPR_COUNTERS: HashMap<u32, BackendCounters> =
    HashMap::pinned(1_048_576, BPF_F_NO_PREALLOC);

#[map]
pub static KPR_RR: HashMap<u32, u32> = HashMap::pinned(262_144, BPF_F_NO_PREALLOC);

#[map]
pub static KPR_AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(65_536, 0);

/// Sockets translated by `connect4`, so `sock_release` can decrement their backend's counter.
#[map]
pub static KPR_SOCKS: HashMap<u64, SockBackend> = HashMap::pinned(262_144, BPF_F_NO_PREALLOC);

/// (socket, backend) -> service address, for `recvmsg4` and `getpeername4`.
#[map]
pub static KPR_REVNAT: LruHashMap<RevNatKey, RevNatValue> = LruHashMap::pinned(262_144, 0);

/// (socket, service address) -> backend, so datagrams of one unconnected UDP socket to one service
/// keep going to the backend the first one chose.
#[map]
pub static KPR_UDP_FWD: LruHashMap<RevNatKey, SockBackend> = LruHashMap::pinned(262_144, 0);

/// Connection tracking of the tc path.
#[map]
pub static KPR_CT: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(262_144, 0);

/// The tc program itself at index 0 (the agent puts it there): a SYN that reuses an earlier
/// connection's 4-tuple forgets that connection's entry and runs the program again by a tail
/// call, which balances it as the new connection it is.
#[map]
pub static KPR_TC_AGAIN: ProgramArray = ProgramArray::pinned(1, 0);

/// Node-wide settings of the tc path (index 0).
#[map]
pub static KPR_CONFIG: Array<NodeConfig> = Array::pinned(1, 0);

/// Node-wide settings of IPv6 (index 0).
#[map]
pub static KPR_CONFIG6: Array<NodeConfig6> = Array::pinned(1, 0);

/// loadBalancerSourceRanges: (tc frontend, source prefix) -> allowed.
#[map]
pub static KPR_SRC_RANGES: LpmTrie<SrcRangeKey, u8> = LpmTrie::pinned(65_536, 0);

/// Backends removed from every Service (id -> its address), whose connected sockets the socket
/// iterators destroy; the agent fills it, runs the iterators and empties it again.
#[map]
pub static KPR_SOCK_TERM: HashMap<u32, Backend> = HashMap::pinned(65_536, BPF_F_NO_PREALLOC);

/// Sockets the iterators destroyed (and destroys refused), by protocol (`proxy_common::TERM_*`).
#[map]
pub static KPR_SOCK_TERM_STATS: Array<u64> = Array::pinned(TERM_STATS, 0);

/// What the XDP program did with the packets it saw, by verdict (`proxy_common::XDP_STAT_*`).
#[map]
pub static KPR_XDP_STATS: PerCpuArray<u64> = PerCpuArray::pinned(XDP_STATS, 0);

/// The DSR program (`kpr_tc_dsr`) at index 0, where the agent runs in `--nodeport-mode dsr` or
/// `hybrid` (empty otherwise: the tail call fails and the tc program goes on without DSR). The
/// tc program hands it a DSR flow's packets that carry the frontend (adding the option) and
/// packets that arrive with the option (recording it), keeping that work off its own verification.
#[map]
pub static KPR_TC_DSR: ProgramArray = ProgramArray::pinned(1, 0);

/// DSR flows whose backend is on this node: (backend -> client, as the replies are addressed)
/// -> the frontend the client sent to, which the egress program writes back as their source.
#[map]
pub static KPR_DSR: LruHashMap<CtKey, DsrFrontend> = LruHashMap::pinned(262_144, 0);

/// What the DSR programs did, by `proxy_common::DSR_STAT_*`.
#[map]
pub static KPR_DSR_STATS: PerCpuArray<u64> = PerCpuArray::pinned(DSR_STATS, 0);
