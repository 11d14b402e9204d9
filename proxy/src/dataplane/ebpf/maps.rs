//! Typed handles on the pinned maps the agent writes, with every write counted and every failure
//! named (a full map becomes `DataplaneError::MapFull` naming the map and the Service).
//!
//! Writes go to the kernel one syscall each, or, between [`Maps::begin_batch`] and
//! [`Maps::flush`] (a full sync), are recorded and applied with batch operations (`batch`): all
//! puts first, in datapath order (counters, backends, rr cursors, slots, then services, so that
//! everything a service entry points at exists before it), then all deletes in the reverse order
//! (a service's count shrinks before its slots go). Several writes of one key keep the last.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError};
use aya::sys::SyscallError;
use aya::Pod;
use proxy_common::{
    Backend, BackendCounters, NodeConfig, NodeConfig6, ServiceKey, ServiceValue, SlotKey,
    SrcRangeKey,
};

use crate::error::DataplaneError;

/// Map names as the eBPF object declares them (pinned under `<bpffs>/maps/<name>`).
pub const SERVICES: &str = "KPR_SERVICES";
pub const SLOTS: &str = "KPR_SLOTS";
pub const BACKENDS: &str = "KPR_BACKENDS";
pub const COUNTERS: &str = "KPR_COUNTERS";
pub const RR: &str = "KPR_RR";
pub const AFFINITY: &str = "KPR_AFFINITY";
pub const SOCKS: &str = "KPR_SOCKS";
pub const REVNAT: &str = "KPR_REVNAT";
pub const UDP_FWD: &str = "KPR_UDP_FWD";
pub const CT: &str = "KPR_CT";
pub const CONFIG: &str = "KPR_CONFIG";
pub const CONFIG6: &str = "KPR_CONFIG6";
pub const SRC_RANGES: &str = "KPR_SRC_RANGES";
pub const SOCK_TERM: &str = "KPR_SOCK_TERM";
pub const SOCK_TERM_STATS: &str = "KPR_SOCK_TERM_STATS";
pub const XDP_STATS: &str = "KPR_XDP_STATS";
/// The tc program's own program array (index 0: itself; `tc::fill_again`).
pub const TC_AGAIN: &str = "KPR_TC_AGAIN";
/// The DSR program's program array (index 0: `kpr_tc_dsr` in dsr/hybrid mode, else empty).
pub const TC_DSR: &str = "KPR_TC_DSR";
/// DSR flows whose backend is on this node: reply key -> frontend (LRU).
pub const DSR: &str = "KPR_DSR";
pub const DSR_STATS: &str = "KPR_DSR_STATS";

/// Every map of the object, for pinning, sizing and cleanup.
pub const ALL: [&str; 20] = [
    SERVICES,
    SLOTS,
    BACKENDS,
    COUNTERS,
    RR,
    AFFINITY,
    SOCKS,
    REVNAT,
    UDP_FWD,
    CT,
    CONFIG,
    CONFIG6,
    SRC_RANGES,
    SOCK_TERM,
    SOCK_TERM_STATS,
    XDP_STATS,
    TC_AGAIN,
    TC_DSR,
    DSR,
    DSR_STATS,
];

/// One hash map with its name and capacity.
pub struct Table<K: Pod, V: Pod> {
    name: &'static str,
    capacity: u32,
    map: HashMap<MapData, K, V>,
    /// Writes recorded while batching, in order (`None` value: delete).
    pending: Option<Vec<Pending<K, V>>>,
}

/// One recorded write and the object (Service port) it belongs to.
struct Pending<K, V> {
    key: K,
    value: Option<V>,
    object: Arc<str>,
}

/// Recorded writes split into puts and deletes.
type Split<K, V> = (Vec<Pending<K, V>>, Vec<Pending<K, V>>);

/// Writes that failed while flushing a batch, by object, and how the flush went.
#[derive(Debug, Default)]
pub struct FlushReport {
    /// Objects with a write that failed (their later writes were skipped), first error each.
    pub failed: Vec<(Arc<str>, DataplaneError)>,
    /// Batch syscalls made.
    pub batches: usize,
    /// Writes applied one syscall each (no batch support in the kernel, or after an error).
    pub singles: usize,
}

impl FlushReport {
    fn fail(&mut self, failed: &mut HashSet<Arc<str>>, object: &Arc<str>, e: DataplaneError) {
        if failed.insert(object.clone()) {
            self.failed.push((object.clone(), e));
        }
    }
}

impl<K: Pod + fmt::Debug + Eq + Hash, V: Pod> Table<K, V> {
    /// Wraps a map taken from the loaded object.
    pub fn new(name: &'static str, map: Map) -> Result<Self, DataplaneError> {
        let capacity = match &map {
            Map::HashMap(d) | Map::LruHashMap(d) => d.info().map(|i| i.max_entries()).unwrap_or(0),
            _ => 0,
        };
        let map = HashMap::try_from(map).map_err(|e| map_err(name, "opening", e))?;
        Ok(Table {
            name,
            capacity,
            map,
            pending: None,
        })
    }

    /// Opens the map pinned at `dir/name`.
    pub fn from_pin(dir: &Path, name: &'static str) -> Result<Self, DataplaneError> {
        Self::from_pin_path(name, &dir.join(name))
    }

    /// Opens the map `name` pinned at `path` (a resize's set-aside pin has another name).
    pub fn from_pin_path(name: &'static str, path: &Path) -> Result<Self, DataplaneError> {
        let data = MapData::from_pin(path)
            .map_err(|e| map_err(name, &format!("opening the pin {}", path.display()), e))?;
        let map = if name == AFFINITY || name == REVNAT || name == UDP_FWD || name == CT {
            Map::LruHashMap(data)
        } else {
            Map::HashMap(data)
        };
        Self::new(name, map)
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Inserts or replaces `key` (or records it, while batching); `object` names the Service
    /// the entry belongs to.
    pub fn put(
        &mut self,
        key: K,
        value: V,
        object: &Arc<str>,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        *ops += 1;
        if let Some(pending) = &mut self.pending {
            pending.push(Pending {
                key,
                value: Some(value),
                object: object.clone(),
            });
            return Ok(());
        }
        self.put_now(key, value, object)
    }

    /// Writes `entries` one syscall each (a resize's copy); with `keep_existing`, a key the map
    /// already holds keeps its value (`BPF_NOEXIST`). Returns how many were written and how
    /// many did not fit (a map resized below what it held: the agent's next sync names the
    /// Services left out, as for any full map).
    pub fn insert_all(
        &mut self,
        entries: Vec<(K, V)>,
        keep_existing: bool,
    ) -> Result<(usize, usize), DataplaneError> {
        const BPF_NOEXIST: u64 = 1;
        let flags = if keep_existing { BPF_NOEXIST } else { 0 };
        let total = entries.len();
        let mut written = 0;
        for (i, (key, value)) in entries.into_iter().enumerate() {
            match self.map.insert(key, value, flags) {
                Ok(()) => written += 1,
                Err(e) if keep_existing && errno(&e) == Some(libc::EEXIST) => {}
                Err(e) => match self.write_err(
                    &key,
                    "an entry carried over by a resize",
                    errno(&e),
                    &e.to_string(),
                ) {
                    DataplaneError::MapFull { .. } => return Ok((written, total - i)),
                    other => return Err(other),
                },
            }
        }
        Ok((written, 0))
    }

    fn put_now(&mut self, key: K, value: V, object: &str) -> Result<(), DataplaneError> {
        self.map
            .insert(key, value, 0)
            .map_err(|e| self.write_err(&key, object, errno(&e), &e.to_string()))
    }

    /// The error of a failed write: a full map names the object.
    fn write_err(&self, key: &K, object: &str, errno: Option<i32>, e: &str) -> DataplaneError {
        match errno {
            Some(libc::E2BIG) | Some(libc::ENOMEM) | Some(libc::ENOSPC) => {
                DataplaneError::MapFull {
                    map: self.name.to_string(),
                    capacity: self.capacity,
                    object: object.to_string(),
                }
            }
            _ => DataplaneError::Other(format!(
                "eBPF map {}: writing {key:?} for {object}: {e}",
                self.name
            )),
        }
    }

    /// Deletes `key` (or records it, while batching); a key that is already gone is not an
    /// error. `object` names the Service the entry belonged to.
    pub fn del(
        &mut self,
        key: &K,
        object: &Arc<str>,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        *ops += 1;
        if let Some(pending) = &mut self.pending {
            pending.push(Pending {
                key: *key,
                value: None,
                object: object.clone(),
            });
            return Ok(());
        }
        self.del_now(key)
    }

    fn del_now(&mut self, key: &K) -> Result<(), DataplaneError> {
        match self.map.remove(key) {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(()),
            Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(()),
            Err(e) => Err(map_err(self.name, &format!("deleting {key:?}"), e)),
        }
    }

    /// The value of `key`, if present (in the kernel: writes being batched are not seen).
    pub fn get(&self, key: &K) -> Result<Option<V>, DataplaneError> {
        match self.map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(None),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(map_err(self.name, &format!("reading {key:?}"), e)),
        }
    }

    /// Whether the map has no entry (one syscall).
    pub fn is_empty(&self) -> Result<bool, DataplaneError> {
        match self.map.keys().next() {
            None => Ok(true),
            Some(Ok(_)) => Ok(false),
            Some(Err(e)) => Err(map_err(self.name, "reading the first key", e)),
        }
    }

    /// Every entry: batch lookups where the kernel has them (a chunk of entries per syscall),
    /// else one pass over the map (two syscalls per entry; entries deleted meanwhile are
    /// skipped). At 100,000 Services an agent restart reads about a million entries.
    pub fn entries(&self) -> Result<Vec<(K, V)>, DataplaneError>
    where
        K: Default,
        V: Default,
    {
        let fd = self.map.map().fd().as_fd();
        match super::batch::lookup_all(fd) {
            Ok(Some(all)) => return Ok(all),
            Ok(None) => {}
            Err(e) => {
                return Err(DataplaneError::Other(format!(
                    "eBPF map {}: batch lookup: {e}",
                    self.name
                )))
            }
        }
        let mut out = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok(kv) => out.push(kv),
                Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => {}
                Err(e) => return Err(map_err(self.name, "iterating", e)),
            }
        }
        Ok(out)
    }

    /// Writes recorded and not yet flushed.
    fn pending_len(&self) -> usize {
        self.pending.as_ref().map_or(0, Vec::len)
    }

    /// Starts recording writes instead of making them.
    fn begin_batch(&mut self) {
        self.pending.get_or_insert_with(Vec::new);
    }

    /// Stops recording and returns the recorded writes, the last one per key, split into puts
    /// and deletes (each in recording order).
    fn take_pending(&mut self) -> Split<K, V> {
        let pending = self.pending.take().unwrap_or_default();
        let mut last: StdHashMap<K, usize> = StdHashMap::with_capacity(pending.len());
        for (i, p) in pending.iter().enumerate() {
            last.insert(p.key, i);
        }
        let (mut puts, mut dels) = (Vec::new(), Vec::new());
        for (i, p) in pending.into_iter().enumerate() {
            if last[&p.key] != i {
                continue;
            }
            match p.value {
                Some(_) => puts.push(p),
                None => dels.push(p),
            }
        }
        (puts, dels)
    }

    /// Applies recorded puts with batch updates, skipping objects that already failed. A write
    /// that fails marks its object failed and the batch goes on after it. Returns the keys whose
    /// write failed.
    fn flush_puts(
        &mut self,
        puts: Vec<Pending<K, V>>,
        failed: &mut HashSet<Arc<str>>,
        report: &mut FlushReport,
    ) -> Vec<K> {
        let puts: Vec<Pending<K, V>> = puts
            .into_iter()
            .filter(|p| !failed.contains(&p.object))
            .collect();
        let keys: Vec<K> = puts.iter().map(|p| p.key).collect();
        let values: Vec<V> = puts.iter().filter_map(|p| p.value).collect();
        let mut bad = Vec::new();
        let mut i = 0;
        while i < keys.len() {
            report.batches += 1;
            let fd = self.map.map().fd().as_fd();
            let Err(e) = super::batch::update(fd, &keys[i..], &values[i..]) else {
                break;
            };
            if e.unsupported() {
                log_fallback(self.name, &e.error);
                for p in &puts[i..] {
                    report.singles += 1;
                    let value = p.value.expect("puts have values");
                    if let Err(err) = self.put_now(p.key, value, &p.object) {
                        bad.push(p.key);
                        report.fail(failed, &p.object, err);
                    }
                }
                break;
            }
            let at = i + e.done;
            let p = &puts[at];
            let errno = e.error.raw_os_error();
            let err = self.write_err(&p.key, &p.object, errno, &e.error.to_string());
            bad.push(p.key);
            report.fail(failed, &p.object, err);
            i = at + 1;
        }
        bad
    }

    /// Applies recorded deletes with batch deletes, skipping objects that failed (their entries
    /// stay until they are removed one by one). Keys already gone are skipped.
    fn flush_dels(
        &mut self,
        dels: Vec<Pending<K, V>>,
        failed: &mut HashSet<Arc<str>>,
        report: &mut FlushReport,
    ) {
        let dels: Vec<Pending<K, V>> = dels
            .into_iter()
            .filter(|p| !failed.contains(&p.object))
            .collect();
        let keys: Vec<K> = dels.iter().map(|p| p.key).collect();
        let mut i = 0;
        while i < keys.len() {
            report.batches += 1;
            let fd = self.map.map().fd().as_fd();
            let Err(e) = super::batch::delete(fd, &keys[i..]) else {
                break;
            };
            if e.unsupported() {
                log_fallback(self.name, &e.error);
                for p in &dels[i..] {
                    report.singles += 1;
                    if let Err(err) = self.del_now(&p.key) {
                        report.fail(failed, &p.object, err);
                    }
                }
                break;
            }
            let at = i + e.done;
            if e.error.raw_os_error() != Some(libc::ENOENT) {
                let p = &dels[at];
                let what = format!("deleting {:?} of {}: {}", p.key, p.object, e.error);
                report.fail(
                    failed,
                    &p.object,
                    DataplaneError::Other(format!("eBPF map {}: {what}", self.name)),
                );
            }
            i = at + 1;
        }
    }
}

/// `KPR_SRC_RANGES`, the loadBalancerSourceRanges trie: a few entries per LoadBalancer Service,
/// written one syscall each, also while the other maps batch (so a frontend's allowed sources
/// exist before the batch writes the frontend that checks them).
pub struct Ranges {
    capacity: u32,
    map: LpmTrie<MapData, SrcRangeKey, u8>,
}

impl Ranges {
    pub fn new(map: Map) -> Result<Self, DataplaneError> {
        let capacity = match &map {
            Map::LpmTrie(d) => d.info().map(|i| i.max_entries()).unwrap_or(0),
            _ => 0,
        };
        let map = LpmTrie::try_from(map).map_err(|e| map_err(SRC_RANGES, "opening", e))?;
        Ok(Ranges { capacity, map })
    }

    /// Opens the trie pinned at `dir/KPR_SRC_RANGES`.
    pub fn from_pin(dir: &Path) -> Result<Self, DataplaneError> {
        Self::from_pin_path(&dir.join(SRC_RANGES))
    }

    /// Opens the trie pinned at `path` (a resize's set-aside pin has another name).
    pub fn from_pin_path(path: &Path) -> Result<Self, DataplaneError> {
        let data = MapData::from_pin(path).map_err(|e| {
            map_err(
                SRC_RANGES,
                &format!("opening the pin {}", path.display()),
                e,
            )
        })?;
        Self::new(Map::LpmTrie(data))
    }

    /// Allows the sources of `key` (a full trie names `object`).
    pub fn put(
        &mut self,
        key: &Key<SrcRangeKey>,
        object: &str,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        *ops += 1;
        self.map.insert(key, 1, 0).map_err(|e| match errno(&e) {
            Some(libc::E2BIG) | Some(libc::ENOMEM) | Some(libc::ENOSPC) => {
                DataplaneError::MapFull {
                    map: SRC_RANGES.to_string(),
                    capacity: self.capacity,
                    object: object.to_string(),
                }
            }
            _ => map_err(
                SRC_RANGES,
                &format!("writing a source range of {object}"),
                e,
            ),
        })
    }

    /// Forgets `key`; one that is already gone is not an error.
    pub fn del(&mut self, key: &Key<SrcRangeKey>, ops: &mut usize) -> Result<(), DataplaneError> {
        *ops += 1;
        match self.map.remove(key) {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(()),
            Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(()),
            Err(e) => Err(map_err(SRC_RANGES, "deleting a source range", e)),
        }
    }

    /// Every key.
    pub fn keys(&self) -> Result<Vec<Key<SrcRangeKey>>, DataplaneError> {
        let mut out = Vec::new();
        for k in self.map.keys() {
            match k {
                Ok(k) => out.push(k),
                Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => {}
                Err(e) => return Err(map_err(SRC_RANGES, "iterating", e)),
            }
        }
        Ok(out)
    }
}

/// Logs (once per map and process) that the kernel has no batch operations.
fn log_fallback(map: &str, e: &std::io::Error) {
    static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.iter().any(|m| m == map) {
        logged.push(map.to_string());
        tracing::info!(
            "ebpf: map {map}: no batch map operations in this kernel ({e}; they need 5.6): \
             writing one element per syscall"
        );
    }
}

fn errno(e: &MapError) -> Option<i32> {
    match e {
        MapError::SyscallError(SyscallError { io_error, .. }) => io_error.raw_os_error(),
        _ => None,
    }
}

fn map_err(name: &str, what: &str, e: MapError) -> DataplaneError {
    DataplaneError::Other(format!("eBPF map {name}: {what}: {e}{}", source_suffix(&e)))
}

fn source_suffix(e: &MapError) -> String {
    match e {
        MapError::SyscallError(SyscallError { io_error, .. }) => format!(" ({io_error})"),
        _ => String::new(),
    }
}

/// The maps the agent writes.
pub struct Maps {
    pub services: Table<ServiceKey, ServiceValue>,
    pub slots: Table<SlotKey, u32>,
    pub backends: Table<u32, Backend>,
    pub counters: Table<u32, BackendCounters>,
    pub rr: Table<u32, u32>,
    pub src_ranges: Ranges,
    pub config: Array<MapData, NodeConfig>,
    pub config6: Array<MapData, NodeConfig6>,
}

impl Maps {
    /// Takes the agent-written maps out of a loaded object.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self, DataplaneError> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no map {name}")))
        };
        Ok(Maps {
            services: Table::new(SERVICES, take(SERVICES)?)?,
            slots: Table::new(SLOTS, take(SLOTS)?)?,
            backends: Table::new(BACKENDS, take(BACKENDS)?)?,
            counters: Table::new(COUNTERS, take(COUNTERS)?)?,
            rr: Table::new(RR, take(RR)?)?,
            src_ranges: Ranges::new(take(SRC_RANGES)?)?,
            config: Array::try_from(take(CONFIG)?).map_err(|e| map_err(CONFIG, "opening", e))?,
            config6: Array::try_from(take(CONFIG6)?).map_err(|e| map_err(CONFIG6, "opening", e))?,
        })
    }

    /// Writes recorded since [`Maps::begin_batch`], not yet flushed.
    pub fn pending_len(&self) -> usize {
        self.services.pending_len()
            + self.slots.pending_len()
            + self.backends.pending_len()
            + self.counters.pending_len()
            + self.rr.pending_len()
    }

    /// Records writes from now on instead of making them, until [`Maps::flush`].
    pub fn begin_batch(&mut self) {
        self.services.begin_batch();
        self.slots.begin_batch();
        self.backends.begin_batch();
        self.counters.begin_batch();
        self.rr.begin_batch();
    }

    /// Applies the recorded writes with batch operations (module docs: puts in datapath order,
    /// then deletes in reverse) and returns to one syscall per write. An object with a failed
    /// write gets none of its later writes (a service entry never points at a slot or backend
    /// that failed); a slot pointing at a backend whose write failed fails its object too.
    pub fn flush(&mut self) -> FlushReport {
        let mut report = FlushReport::default();
        let mut failed = HashSet::new();
        let (counter_puts, counter_dels) = self.counters.take_pending();
        let (backend_puts, backend_dels) = self.backends.take_pending();
        let (rr_puts, rr_dels) = self.rr.take_pending();
        let (slot_puts, slot_dels) = self.slots.take_pending();
        let (svc_puts, svc_dels) = self.services.take_pending();
        let mut bad: HashSet<u32> = HashSet::new();
        bad.extend(
            self.counters
                .flush_puts(counter_puts, &mut failed, &mut report),
        );
        bad.extend(
            self.backends
                .flush_puts(backend_puts, &mut failed, &mut report),
        );
        self.rr.flush_puts(rr_puts, &mut failed, &mut report);
        if !bad.is_empty() {
            for p in &slot_puts {
                let id = p.value.unwrap_or_default();
                if bad.contains(&id) {
                    let e = DataplaneError::Other(format!(
                        "eBPF map {SLOTS}: slot {:?} of {} points at backend id {id}, whose \
                         write failed",
                        p.key, p.object
                    ));
                    report.fail(&mut failed, &p.object, e);
                }
            }
        }
        self.slots.flush_puts(slot_puts, &mut failed, &mut report);
        self.services.flush_puts(svc_puts, &mut failed, &mut report);
        self.services.flush_dels(svc_dels, &mut failed, &mut report);
        self.slots.flush_dels(slot_dels, &mut failed, &mut report);
        self.rr.flush_dels(rr_dels, &mut failed, &mut report);
        self.backends
            .flush_dels(backend_dels, &mut failed, &mut report);
        self.counters
            .flush_dels(counter_dels, &mut failed, &mut report);
        report
    }

    /// Writes the node-wide settings of the tc path.
    pub fn set_config(&mut self, config: NodeConfig) -> Result<(), DataplaneError> {
        self.config
            .set(0, config, 0)
            .map_err(|e| map_err(CONFIG, "writing index 0", e))
    }

    /// Writes the node-wide settings of IPv6.
    pub fn set_config6(&mut self, config: NodeConfig6) -> Result<(), DataplaneError> {
        self.config6
            .set(0, config, 0)
            .map_err(|e| map_err(CONFIG6, "writing index 0", e))
    }
}

/// A pinned per-CPU array of `u64` counters (the programs' statistics maps), read as sums over
/// the CPUs; errors name the map.
pub struct PinnedCounters {
    name: &'static str,
    map: aya::maps::PerCpuArray<MapData, u64>,
}

impl PinnedCounters {
    /// Opens `<maps_dir>/<name>`.
    pub fn open(maps_dir: &Path, name: &'static str) -> Result<Self, DataplaneError> {
        let data = MapData::from_pin(maps_dir.join(name))
            .map_err(|e| Self::error(name, "opening the pin", &e))?;
        let map = aya::maps::PerCpuArray::try_from(Map::PerCpuArray(data))
            .map_err(|e| Self::error(name, "opening", &e))?;
        Ok(PinnedCounters { name, map })
    }

    /// Counter `index` summed over the CPUs.
    pub fn sum(&self, index: u32) -> Result<u64, DataplaneError> {
        Ok(self
            .map
            .get(&index, 0)
            .map_err(|e| Self::error(self.name, "reading", &e))?
            .iter()
            .sum())
    }

    fn error(name: &str, what: &str, e: &dyn fmt::Display) -> DataplaneError {
        DataplaneError::Other(format!("eBPF map {name}: {what}: {e}"))
    }
}
