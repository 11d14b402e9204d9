//! Typed handles on the pinned maps the agent writes, with every write counted and every failure
//! named (a full map becomes `DataplaneError::MapFull` naming the map and the Service).

use std::fmt;
use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData, MapError};
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
}

impl<K: Pod + fmt::Debug, V: Pod> Table<K, V> {
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

    /// Inserts or replaces `key`; `object` names the Service the entry belongs to.
    pub fn put(
        &mut self,
        key: K,
        value: V,
        object: &str,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        *ops += 1;
        self.map.insert(key, value, 0).map_err(|e| match errno(&e) {
            Some(libc::E2BIG) | Some(libc::ENOMEM) | Some(libc::ENOSPC) => {
                DataplaneError::MapFull {
                    map: self.name.to_string(),
                    capacity: self.capacity,
                    object: object.to_string(),
                }
            }
            _ => map_err(self.name, &format!("writing {key:?} for {object}"), e),
        })
    }

    /// Deletes `key`; a key that is already gone is not an error.
    pub fn del(&mut self, key: &K, ops: &mut usize) -> Result<(), DataplaneError> {
        *ops += 1;
        match self.map.remove(key) {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(()),
            Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(()),
            Err(e) => Err(map_err(self.name, &format!("deleting {key:?}"), e)),
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
