//! Map sizes across restarts, and what each map costs the kernel.
//!
//! Resizing without losing entries: a pinned map whose `max_entries` differs from the size the
//! agent now asks for (`--bpf-*-max`) is set aside before the object is loaded (its pin renamed
//! `<MAP>_RESIZING`), so the loader creates the map anew at the new size. Its entries are copied
//! into the new map before anything reads it (the agent's own maps: frontends, slots, backends,
//! source ranges, so the restarted agent finds what it programmed); the maps the programs write
//! (flows, conntrack, affinity, sockets) are copied again after the new programs are attached,
//! keeping what the new programs wrote meanwhile, so connections the old programs tracked in the
//! gap keep their entries. Then the set-aside pin is removed and the old map is freed with the
//! old programs' links. An agent stopped mid-resize leaves the set-aside pin; the next start
//! carries its entries over as well.
//!
//! Kernel memory: each map's `memlock` (what the kernel charges for it: preallocated LRU maps
//! their whole size, the others what they hold), for the start log and `proxy inspect --maps`.
//!
//! Owns no loading or attaching (`attach`) and no map layout (`maps`, `proxy_common`).

use std::fmt::Debug;
use std::fs;
use std::hash::Hash;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use aya::maps::MapData;
use aya::Pod;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, BackendCounters, CtKey, CtValue, DsrFrontend, RevNatKey,
    RevNatValue, ServiceKey, ServiceValue, SlotKey, SockBackend,
};

use super::attach::{MapSizes, Pins};
use super::maps::{self, Ranges, Table};
use crate::error::DataplaneError;

/// The suffix of a set-aside map's pin (bpffs takes no dot in a name).
const ASIDE: &str = "_RESIZING";

/// Maps the programs write: copied again after the new programs are attached.
const PROGRAM_WRITTEN: [&str; 7] = [
    maps::AFFINITY,
    maps::SOCKS,
    maps::REVNAT,
    maps::UDP_FWD,
    maps::CT,
    maps::COUNTERS,
    maps::DSR,
];

/// A pinned map being resized: its old pin set aside until its entries are carried over.
#[derive(Debug)]
pub struct Resized {
    pub name: &'static str,
    /// The old size (`max_entries`).
    pub from: u32,
    /// The size asked for.
    pub to: u32,
    aside: PathBuf,
    /// Entries carried over by the first copy.
    pub copied: usize,
    /// Entries that did not fit in the new size (a map made smaller than what it held).
    pub dropped: usize,
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> DataplaneError {
    move |e| DataplaneError::io(what, e)
}

/// `max_entries` of the map pinned at `path`.
fn max_entries(name: &str, path: &Path) -> Result<u32, DataplaneError> {
    let data = MapData::from_pin(path).map_err(|e| {
        DataplaneError::Other(format!(
            "eBPF map {name}: opening the pin {}: {e}",
            path.display()
        ))
    })?;
    data.info().map(|i| i.max_entries()).map_err(|e| {
        DataplaneError::Other(format!(
            "eBPF map {name}: reading the info of {}: {e}",
            path.display()
        ))
    })
}

/// Sets aside every pinned map whose size differs from `sizes`, and takes up maps a stopped
/// agent left set aside. Call before loading the object.
pub fn set_aside(pins: &Pins, sizes: &MapSizes) -> Result<Vec<Resized>, DataplaneError> {
    let dir = pins.maps();
    let mut out = Vec::new();
    for name in maps::ALL {
        let Some(to) = sizes.of(name) else {
            continue;
        };
        let pin = dir.join(name);
        let aside = dir.join(format!("{name}{ASIDE}"));
        let from = if aside.exists() {
            // A previous agent stopped mid-resize. The map it created may have another size
            // than the one asked for now: drop it (what it held beyond the set-aside entries is
            // flows of the few moments that agent ran) and resize from the set-aside map.
            if pin.exists() && max_entries(name, &pin)? != to {
                fs::remove_file(&pin).map_err(io_err(format!("removing {}", pin.display())))?;
            }
            max_entries(name, &aside)?
        } else {
            if !pin.exists() {
                continue;
            }
            let from = max_entries(name, &pin)?;
            if from == to {
                continue;
            }
            fs::rename(&pin, &aside).map_err(io_err(format!(
                "setting {} aside to resize it",
                pin.display()
            )))?;
            from
        };
        out.push(Resized {
            name,
            from,
            to,
            aside,
            copied: 0,
            dropped: 0,
        });
    }
    Ok(out)
}

/// Copies the set-aside maps' entries into the new maps (after loading, before the agent reads
/// its maps).
pub fn copy_entries(pins: &Pins, resized: &mut [Resized]) -> Result<(), DataplaneError> {
    let dir = pins.maps();
    for r in resized.iter_mut() {
        (r.copied, r.dropped) = copy_one(r.name, &r.aside, &dir.join(r.name), false)?;
    }
    Ok(())
}

/// After the new programs are attached: copies once more what the old programs wrote since
/// [`copy_entries`] (keeping the new programs' entries), removes the set-aside pins and logs
/// each resize.
pub fn finish(pins: &Pins, resized: Vec<Resized>) -> Result<(), DataplaneError> {
    let dir = pins.maps();
    for r in resized {
        let late = if PROGRAM_WRITTEN.contains(&r.name) {
            copy_one(r.name, &r.aside, &dir.join(r.name), true)?.0
        } else {
            0
        };
        if r.dropped > 0 {
            tracing::warn!(
                "ebpf: map {}: {} entries did not fit in its new size of {} (what they served \
                 is programmed again, or named as not fitting, by the next sync)",
                r.name,
                r.dropped,
                r.to
            );
        }
        fs::remove_file(&r.aside).map_err(io_err(format!("removing {}", r.aside.display())))?;
        tracing::info!(
            "ebpf: map {} resized from {} to {} entries; {} entries carried over{}",
            r.name,
            r.from,
            r.to,
            r.copied,
            if late > 0 {
                format!(" and {late} written by the old programs meanwhile")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// Copies the entries of the map pinned at `from` into the one pinned at `to`; with
/// `keep_existing`, entries the new map already has stay. Returns how many were written and
/// how many did not fit.
fn copy_one(
    name: &'static str,
    from: &Path,
    to: &Path,
    keep_existing: bool,
) -> Result<(usize, usize), DataplaneError> {
    match name {
        maps::SERVICES => copy::<ServiceKey, ServiceValue>(name, from, to, keep_existing),
        maps::SLOTS => copy::<SlotKey, u32>(name, from, to, keep_existing),
        maps::BACKENDS => copy::<u32, Backend>(name, from, to, keep_existing),
        maps::COUNTERS => copy::<u32, BackendCounters>(name, from, to, keep_existing),
        maps::RR => copy::<u32, u32>(name, from, to, keep_existing),
        maps::AFFINITY => copy::<AffinityKey, AffinityValue>(name, from, to, keep_existing),
        maps::SOCKS => copy::<u64, SockBackend>(name, from, to, keep_existing),
        maps::REVNAT => copy::<RevNatKey, RevNatValue>(name, from, to, keep_existing),
        maps::UDP_FWD => copy::<RevNatKey, SockBackend>(name, from, to, keep_existing),
        maps::CT => copy::<CtKey, CtValue>(name, from, to, keep_existing),
        maps::DSR => copy::<CtKey, DsrFrontend>(name, from, to, keep_existing),
        maps::SOCK_TERM => copy::<u32, Backend>(name, from, to, keep_existing),
        maps::SRC_RANGES => {
            let old = Ranges::from_pin_path(from)?;
            let mut new = Ranges::from_pin_path(to)?;
            let keys = old.keys()?;
            let total = keys.len();
            let mut ops = 0;
            for (i, k) in keys.iter().enumerate() {
                match new.put(k, "a source range carried over", &mut ops) {
                    Ok(()) => {}
                    Err(DataplaneError::MapFull { .. }) => return Ok((i, total - i)),
                    Err(e) => return Err(e),
                }
            }
            Ok((total, 0))
        }
        // Arrays have a fixed size: never resized.
        _ => Ok((0, 0)),
    }
}

fn copy<K, V>(
    name: &'static str,
    from: &Path,
    to: &Path,
    keep_existing: bool,
) -> Result<(usize, usize), DataplaneError>
where
    K: Pod + Debug + Eq + Hash + Default,
    V: Pod + Default,
{
    let old = Table::<K, V>::from_pin_path(name, from)?;
    let mut new = Table::<K, V>::from_pin_path(name, to)?;
    new.insert_all(old.entries()?, keep_existing)
}

/// What one map costs: its size and the kernel memory charged for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    pub name: &'static str,
    pub max_entries: u32,
    /// `memlock` of the map's fd in bytes (None where the kernel does not report it).
    pub kernel_bytes: Option<u64>,
}

impl Footprint {
    /// "N entries at most, X MiB of kernel memory", for logs and `proxy inspect --maps`.
    pub fn describe(&self) -> String {
        format!(
            "{} entries at most, {}",
            self.max_entries,
            self.kernel_bytes
                .map(|b| format!("{:.1} MiB of kernel memory", b as f64 / 1048576.0))
                .unwrap_or_else(|| "kernel memory not reported".into())
        )
    }
}

/// The kernel memory of all `maps` in MiB.
pub fn total_mib(maps: &[Footprint]) -> f64 {
    maps.iter().filter_map(|f| f.kernel_bytes).sum::<u64>() as f64 / 1048576.0
}

/// The kernel memory charged for the map behind `data` (`memlock` in its fd's fdinfo).
fn kernel_bytes(data: &MapData) -> Option<u64> {
    let fd = data.fd().as_fd().as_raw_fd();
    let text = fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Every map pinned in `maps_dir`, in [`maps::ALL`]'s order, with its size and kernel memory.
pub fn footprints(maps_dir: &Path) -> Vec<Footprint> {
    maps::ALL
        .iter()
        .filter_map(|&name| {
            let data = MapData::from_pin(maps_dir.join(name)).ok()?;
            Some(Footprint {
                name,
                max_entries: data.info().map(|i| i.max_entries()).unwrap_or(0),
                kernel_bytes: kernel_bytes(&data),
            })
        })
        .collect()
}

/// Logs each map's size and kernel memory, and the total (at start, after loading).
pub fn log_footprints(pins: &Pins) {
    let all = footprints(&pins.maps());
    for f in &all {
        tracing::info!("ebpf: map {}: {}", f.name, f.describe());
    }
    tracing::info!(
        "ebpf: {} maps, {:.1} MiB of kernel memory in all (sizes: --bpf-*-max flags)",
        all.len(),
        total_mib(&all)
    );
}
