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
use std::rc::Rc;

use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError};
use aya::sys::SyscallError;
use aya::Pod;
use proxy_common::{Backend, BackendCounters, NodeConfig, ServiceKey, ServiceValue, SlotKey};

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

/// Every map of the object, for pinning, sizing and cleanup.
pub const ALL: [&str; 11] = [
    SERVICES, SLOTS, BACKENDS, COUNTERS, RR, AFFINITY, SOCKS, REVNAT, UDP_FWD, CT, CONFIG,
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
    object: Rc<str>,
}

/// Writes that failed while flushing a batch, by object, and how the flush went.
#[derive(Debug, Default)]
pub struct FlushReport {
    /// Objects with a write that failed (their later writes were skipped), first error each.
    pub failed: Vec<(Rc<str>, DataplaneError)>,
    /// Batch syscalls made.
    pub batches: usize,
    /// Writes applied one syscall each (no batch support in the kernel, or after an error).
    pub singles: usize,
}

impl FlushReport {
    fn fail(&mut self, failed: &mut HashSet<Rc<str>>, object: &Rc<str>, e: DataplaneError) {
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
        let path = dir.join(name);
        let data = MapData::from_pin(&path)
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
        object: &Rc<str>,
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
    pub fn del(&mut self, key: &K, object: &Rc<str>, ops: &mut usize) -> Result<(), DataplaneError> {
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

    /// Starts recording writes instead of making them.
    fn begin_batch(&mut self) {
        self.pending.get_or_insert_with(Vec::new);
    }

    /// Stops recording and returns the recorded writes, the last one per key, split into puts
    /// and deletes (each in recording order).
    fn take_pending(&mut self) -> (Vec<Pending<K, V>>, Vec<Pending<K, V>>) {
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
    /// that fails marks its object failed; the rest of the batch goes on.
    fn flush_puts(
        &mut self,
        puts: Vec<Pending<K, V>>,
        failed: &mut HashSet<Rc<str>>,
        report: &mut FlushReport,
    ) -> Vec<Pending<K, V>> {
        let puts: Vec<Pending<K, V>> = puts
            .into_iter()
            .filter(|p| !failed.contains(&p.object))
            .collect();
        let keys: Vec<K> = puts.iter().map(|p| p.key).collect();
        let values: Vec<V> = puts.iter().filter_map(|p| p.value).collect();
        let mut rejected = Vec::new();
        let mut i = 0;
        while i < keys.len() {
            report.batches += 1;
            let fd = self.map.map().fd().as_fd();
            let Err(e) = super::batch::update(fd, &keys[i..], &values[i..]) else {
                break;
            };
            if e.unsupported() {
                self.fallback_puts(&puts[i..], failed, report, &mut rejected);
                break;
            }
            let at = i + e.done;
            let p = &puts[at];
            let err = self.write_err(&p.key, &p.object, e.error.raw_os_error(), &e.error.to_string());
            report.fail(failed, &p.object, err);
            i = at + 1;
        }
        for (k, p) in puts.into_iter().enumerate() {
            if failed.contains(&p.object) && !rejected.contains(&k) {
                rejected.push(k);
            }
            let _ = p;
        }
        Vec::new()
    }
}

    /// The value of `key`, if present.
    pub fn get(&self, key: &K) -> Result<Option<V>, DataplaneError> {
        match self.map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(None),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(map_err(self.name, &format!("reading {key:?}"), e)),
        }
    }

    /// Every entry (one pass over the map; entries deleted meanwhile are skipped).
    pub fn entries(&self) -> Result<Vec<(K, V)>, DataplaneError> {
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
    pub config: Array<MapData, NodeConfig>,
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
            config: Array::try_from(take(CONFIG)?).map_err(|e| map_err(CONFIG, "opening", e))?,
        })
    }

    /// Writes the node-wide settings of the tc path.
    pub fn set_config(&mut self, config: NodeConfig) -> Result<(), DataplaneError> {
        self.config
            .set(0, config, 0)
            .map_err(|e| map_err(CONFIG, "writing index 0", e))
    }
}
