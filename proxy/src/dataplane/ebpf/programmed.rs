//! What the agent has written into the maps, per service port, and the diff that brings one
//! service port from its programmed entries to its desired ones (touching only what differs).
//!
//! Ids: a backend set id per (service port, set kind) and a backend id per endpoint address, both
//! allocated monotonically and never reused while the maps live, so a socket released after its
//! backend was removed cannot decrement somebody else's counter. After a restart, ids are recovered
//! from the pinned maps (same endpoint, same id: least-connection counts survive), and the first
//! full sync sweeps whatever no desired service claimed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proxy_common::{
    Backend, BackendCounters, ServiceKey, ServiceValue, SlotKey, FAMILY_V4, FAMILY_V6, SVC_F_VIP,
};

use super::compile::{
    addr_from_words, addr_words, family_of, key_is_v6, BackendAddr, DesiredService, SetKind,
    SrcRange,
};
use super::maps::{FlushReport, Maps};
use crate::error::DataplaneError;
use crate::model::{Protocol, ServicePortName};

/// One backend set as programmed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SetState {
    id: u32,
    /// Backend ids by slot (one slot per backend, or a Maglev table's slots); `None` for a set
    /// recovered from pinned maps (slots unknown).
    backends: Option<Vec<u32>>,
    /// The set's distinct backends (each holds one reference).
    addrs: Vec<BackendAddr>,
}

impl SetState {
    /// How many slots the set has in `KPR_SLOTS`.
    fn slot_count(&self) -> usize {
        self.backends.as_ref().map_or(self.addrs.len(), Vec::len)
    }
}

/// A service port's backend sets, in kind order. Most ports use one or two of the four kinds
/// (two per family), so they are kept in a vector sized to what is used: at 100,000 service
/// ports, an inline slot per kind (or a map) cost more than the sets themselves.
#[derive(Debug, Clone, Default)]
struct Sets(Vec<(SetKind, SetState)>);

impl Sets {
    fn get(&self, kind: &SetKind) -> Option<&SetState> {
        self.0.iter().find(|(k, _)| k == kind).map(|(_, s)| s)
    }

    fn get_mut(&mut self, kind: &SetKind) -> Option<&mut SetState> {
        self.0.iter_mut().find(|(k, _)| k == kind).map(|(_, s)| s)
    }

    fn insert(&mut self, kind: SetKind, set: SetState) {
        match self
            .0
            .binary_search_by_key(&kind.index(), |(k, _)| k.index())
        {
            Ok(at) => self.0[at].1 = set,
            Err(at) => self.0.insert(at, (kind, set)),
        }
    }

    /// The sets in kind order (IPv4 cluster, external, then IPv6's).
    fn iter(&self) -> impl Iterator<Item = (SetKind, &SetState)> {
        self.0.iter().map(|(k, s)| (*k, s))
    }

    fn values(&self) -> impl Iterator<Item = &SetState> {
        self.0.iter().map(|(_, s)| s)
    }
}

/// One service port as programmed. Its few frontends are a vector, not a map: a hash map's
/// smallest table holds four entries and its own header, for the one or two most ports have.
#[derive(Debug, Clone, Default)]
struct SvcState {
    frontends: Vec<(ServiceKey, ServiceValue)>,
    sets: Sets,
    /// clusterIP marker keys this service port holds a reference on.
    vips: Vec<ServiceKey>,
    /// Allowed sources of its guarded LB IP frontends.
    ranges: Vec<SrcRange>,
}

impl SvcState {
    fn frontend(&self, key: &ServiceKey) -> Option<&ServiceValue> {
        self.frontends
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Sets `key`'s value, adding the frontend if it is new.
    fn set_frontend(&mut self, key: ServiceKey, value: ServiceValue) {
        match self.frontends.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.frontends.push((key, value)),
        }
    }

    /// Frees what building the state reserved beyond its entries (it is kept until the next
    /// change of the port).
    fn shrink(&mut self) {
        self.frontends.shrink_to_fit();
        self.sets.0.shrink_to_fit();
        for (_, set) in &mut self.sets.0 {
            set.addrs.shrink_to_fit();
            if let Some(b) = &mut set.backends {
                b.shrink_to_fit();
            }
        }
        self.vips.shrink_to_fit();
        self.ranges.shrink_to_fit();
    }
}

#[derive(Debug, Clone, Copy)]
struct BackendRef {
    id: u32,
    refs: usize,
}

/// What a previous agent left in the pinned maps.
#[derive(Debug, Default)]
struct Recovered {
    frontends: HashMap<ServiceKey, ServiceValue>,
    backends: HashMap<BackendAddr, u32>,
}

/// The programmed state of every service port.
#[derive(Debug, Default)]
pub struct Programmed {
    services: HashMap<ServicePortName, SvcState>,
    /// The set ids `services` hold, kept with it so that claiming a recovered set id is O(1)
    /// (a scan of every service per new set made a 20,000-Service full sync quadratic).
    claimed_sets: HashSet<u32>,
    backends: HashMap<BackendAddr, BackendRef>,
    /// clusterIP markers, shared by the ports of one Service.
    vip_refs: HashMap<ServiceKey, usize>,
    recovered: Recovered,
    next_set: u32,
    next_backend: u32,
    /// Entries not claimed by any service port may exist (start-up, after an error).
    pub needs_sweep: bool,
    /// Backends deleted from the maps since [`Programmed::take_released`] (their sockets are
    /// destroyed where the kernel can, `sockterm`).
    released: Vec<(u32, Backend)>,
}

impl Programmed {
    /// Reads what earlier runs left in the (pinned) maps.
    pub fn recover(maps: &Maps) -> Result<Self, DataplaneError> {
        let mut p = Programmed {
            next_set: 1,
            next_backend: 1,
            needs_sweep: true,
            ..Programmed::default()
        };
        for (key, value) in maps.services.entries()? {
            p.next_set = p.next_set.max(value.set_id + 1);
            p.recovered.frontends.insert(key, value);
        }
        for (id, b) in maps.backends.entries()? {
            p.next_backend = p.next_backend.max(id + 1);
            if let Some(addr) = backend_addr(&b) {
                p.recovered.backends.insert(addr, id);
            }
        }
        for (set_id, _) in maps.rr.entries()? {
            p.next_set = p.next_set.max(set_id + 1);
        }
        // Sweeping reads every map entry by entry (seconds at 100,000 Services): only when an
        // earlier agent left something behind.
        p.needs_sweep = !(p.recovered.frontends.is_empty()
            && p.next_backend == 1
            && p.next_set == 1
            && maps.slots.is_empty()?
            && maps.counters.is_empty()?);
        Ok(p)
    }

    /// Makes room for `n` service ports at once (a full sync), instead of the map growing
    /// by doubling, which holds the old and the new table together for a moment.
    pub fn reserve(&mut self, n: usize) {
        self.services.reserve(n.saturating_sub(self.services.len()));
    }

    /// Number of programmed service ports.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Names of every programmed service port.
    pub fn names(&self) -> impl Iterator<Item = &ServicePortName> {
        self.services.keys()
    }

    /// Brings `name` to `desired` (`None`: remove it). On error the service port is removed
    /// entirely (no half-programmed service stays behind) and the error names it.
    pub fn apply(
        &mut self,
        maps: &mut Maps,
        name: &ServicePortName,
        desired: Option<&DesiredService>,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        let old = self.services.remove(name).unwrap_or_default();
        for set in old.sets.values() {
            self.claimed_sets.remove(&set.id);
        }
        let Some(desired) = desired else {
            return self.remove(maps, name, old, ops);
        };
        let object: Arc<str> = object_name(name).into();
        let mut new = SvcState::default();
        match self.write(maps, &object, &old, desired, &mut new, ops) {
            Ok(()) => {
                self.finish(maps, &object, &old, &new, ops)?;
                self.claimed_sets
                    .extend(new.sets.values().map(|set| set.id));
                new.shrink();
                self.services.insert(name.clone(), new);
                Ok(())
            }
            Err(e) => {
                // Remove what was written of the new state and what remains of the old one.
                let _ = self.remove(maps, name, new, ops);
                let _ = self.remove(maps, name, old, ops);
                self.needs_sweep = true;
                Err(e)
            }
        }
    }

    /// Writes sets, slots and frontends of `desired` (new entries before the values that use them).
    fn write(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        old: &SvcState,
        desired: &DesiredService,
        new: &mut SvcState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        for kind in desired.kinds() {
            self.write_set(maps, object, old, desired, kind, new, ops)?;
        }
        // Allowed sources before the frontends that check them (written at once, not batched).
        for r in &desired.source_ranges {
            new.ranges.push(*r);
            if !old.ranges.contains(r) {
                maps.src_ranges.put(&r.key(), object, ops)?;
            }
        }
        for f in &desired.frontends {
            let set = new
                .sets
                .get(&f.set)
                .expect("every frontend's set is registered");
            let value = ServiceValue {
                set_id: set.id,
                count: set.slot_count() as u32,
                affinity_timeout_s: f.affinity_timeout_s,
                flags: f.flags,
                algorithm: f.algorithm,
                family: key_family(&f.key),
            };
            if old.frontend(&f.key) != Some(&value) {
                maps.services.put(f.key, value, object, ops)?;
            }
            new.set_frontend(f.key, value);
        }
        for key in &desired.vips {
            // Registered first, so that an error releases exactly what was acquired.
            new.vips.push(*key);
            let refs = self.vip_refs.entry(*key).or_insert(0);
            *refs += 1;
            if *refs == 1 {
                let marker = ServiceValue {
                    flags: SVC_F_VIP,
                    family: key_family(key),
                    ..ServiceValue::default()
                };
                maps.services.put(*key, marker, object, ops)?;
            }
        }
        Ok(())
    }

    /// Writes one backend set. The set is registered in `new` before any backend is acquired, so
    /// that an error releases exactly what was acquired.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the arguments are the diff"
    )]
    fn write_set(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        old: &SvcState,
        desired: &DesiredService,
        kind: SetKind,
        new: &mut SvcState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        let previous = old.sets.get(&kind);
        let (id, old_slots, fresh) = match previous {
            Some(s) => (s.id, s.backends.clone(), false),
            None => match self.recover_set(desired, kind) {
                Some(id) => (id, None, false),
                None => {
                    let id = self.next_set;
                    self.next_set += 1;
                    (id, Some(Vec::new()), true)
                }
            },
        };
        new.sets.insert(
            kind,
            SetState {
                id,
                backends: Some(Vec::new()),
                addrs: Vec::new(),
            },
        );
        if fresh || (previous.is_none() && maps.rr.get(&id)?.is_none()) {
            maps.rr.put(id, 0, object, ops)?;
        }
        let mut ids = Vec::with_capacity(desired.set(kind).len());
        for addr in desired.set(kind) {
            let bid = self.acquire_backend(maps, object, addr, ops)?;
            let set = new.sets.get_mut(&kind).expect("registered above");
            set.addrs.push(*addr);
            ids.push(bid);
        }
        let slots = match desired.maglev_table(kind) {
            Some(table) if !ids.is_empty() => maglev_slots(table, desired.set(kind), &ids)?,
            _ => ids,
        };
        // Registered before the writes, so that an error deletes exactly the slots written.
        let set = new.sets.get_mut(&kind).expect("registered above");
        let slots = &*set.backends.insert(slots);
        for (slot, bid) in slots.iter().enumerate() {
            // Only slots that changed are written: a Maglev table moves few slots per change.
            let unchanged = old_slots.as_ref().and_then(|o| o.get(slot)) == Some(bid);
            if !unchanged {
                maps.slots.put(slot_key(id, slot), *bid, object, ops)?;
            }
        }
        Ok(())
    }

    /// The set id an earlier agent used for this service port's `kind` frontends.
    fn recover_set(&mut self, desired: &DesiredService, kind: SetKind) -> Option<u32> {
        desired
            .frontends
            .iter()
            .filter(|f| f.set == kind)
            .find_map(|f| self.recovered.frontends.get(&f.key))
            .map(|v| v.set_id)
            .filter(|id| !self.claimed_sets.contains(id))
    }

    /// Deletes what `old` had and `new` no longer has, then releases old backend references.
    fn finish(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        old: &SvcState,
        new: &SvcState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        for (key, _) in &old.frontends {
            if new.frontend(key).is_none() {
                maps.services.del(key, object, ops)?;
            }
        }
        for r in &old.ranges {
            if !new.ranges.contains(r) {
                maps.src_ranges.del(&r.key(), ops)?;
            }
        }
        for (kind, set) in old.sets.iter() {
            let kept = new.sets.get(&kind).filter(|n| n.id == set.id);
            let from = kept.map_or(0, |n| n.slot_count());
            for slot in from..set.slot_count() {
                maps.slots.del(&slot_key(set.id, slot), object, ops)?;
            }
            if kept.is_none() {
                maps.rr.del(&set.id, object, ops)?;
            }
            self.release_set(maps, object, set, ops)?;
        }
        for key in &old.vips {
            let refs = self.vip_refs.entry(*key).or_insert(1);
            *refs -= 1;
            if *refs == 0 {
                self.vip_refs.remove(key);
                maps.services.del(key, object, ops)?;
            }
        }
        Ok(())
    }

    fn remove(
        &mut self,
        maps: &mut Maps,
        name: &ServicePortName,
        old: SvcState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        let object: Arc<str> = object_name(name).into();
        self.finish(maps, &object, &old, &SvcState::default(), ops)
    }

    fn acquire_backend(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        addr: &BackendAddr,
        ops: &mut usize,
    ) -> Result<u32, DataplaneError> {
        if let Some(r) = self.backends.get_mut(addr) {
            r.refs += 1;
            return Ok(r.id);
        }
        let id = match self.recovered.backends.remove(addr) {
            Some(id) => {
                if maps.counters.get(&id)?.is_none() {
                    maps.counters
                        .put(id, BackendCounters::default(), object, ops)?;
                }
                id
            }
            None => {
                let id = self.next_backend;
                self.next_backend += 1;
                maps.counters
                    .put(id, BackendCounters::default(), object, ops)?;
                maps.backends.put(id, backend_value(addr), object, ops)?;
                id
            }
        };
        self.backends.insert(*addr, BackendRef { id, refs: 1 });
        Ok(id)
    }

    fn release_set(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        set: &SetState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        for addr in &set.addrs {
            let Some(r) = self.backends.get_mut(addr) else {
                continue;
            };
            r.refs -= 1;
            if r.refs == 0 {
                let id = r.id;
                self.backends.remove(addr);
                self.released.push((id, backend_value(addr)));
                maps.backends.del(&id, object, ops)?;
                maps.counters.del(&id, object, ops)?;
            }
        }
        Ok(())
    }

    /// Deletes every map entry no programmed service port claims (after a restart or an error).
    pub fn sweep(&mut self, maps: &mut Maps, ops: &mut usize) -> Result<(), DataplaneError> {
        let frontends: HashSet<ServiceKey> = self
            .services
            .values()
            .flat_map(|s| s.frontends.iter().map(|(k, _)| *k))
            .chain(self.vip_refs.keys().copied())
            .collect();
        let sets: HashMap<u32, usize> = self
            .services
            .values()
            .flat_map(|s| s.sets.values().map(|set| (set.id, set.slot_count())))
            .collect();
        let backends: HashSet<u32> = self.backends.values().map(|r| r.id).collect();
        let object: Arc<str> = Arc::from("the sweep of unclaimed entries");
        let object = &object;
        for (key, _) in maps.services.entries()? {
            if !frontends.contains(&key) {
                maps.services.del(&key, object, ops)?;
            }
        }
        for (key, _) in maps.slots.entries()? {
            if sets
                .get(&key.set_id)
                .is_none_or(|len| key.slot as usize >= *len)
            {
                maps.slots.del(&key, object, ops)?;
            }
        }
        for (id, _) in maps.rr.entries()? {
            if !sets.contains_key(&id) {
                maps.rr.del(&id, object, ops)?;
            }
        }
        for (id, b) in maps.backends.entries()? {
            if !backends.contains(&id) {
                maps.backends.del(&id, object, ops)?;
                // Removed while no agent ran: its sockets go as they would have then.
                self.released.push((id, b));
            }
        }
        for (id, _) in maps.counters.entries()? {
            if !backends.contains(&id) {
                maps.counters.del(&id, object, ops)?;
            }
        }
        let ranges: HashSet<Vec<u8>> = self
            .services
            .values()
            .flat_map(|s| s.ranges.iter().map(|r| key_bytes(&r.key())))
            .collect();
        for key in maps.src_ranges.keys()? {
            if !ranges.contains(&key_bytes(&key)) {
                maps.src_ranges.del(&key, ops)?;
            }
        }
        self.recovered = Recovered::default();
        self.needs_sweep = false;
        Ok(())
    }

    /// The backends deleted from the maps since the last call (ids are never reused, so a
    /// socket still recorded with one of them was connected to that endpoint).
    pub fn take_released(&mut self) -> Vec<(u32, Backend)> {
        std::mem::take(&mut self.released)
    }

    /// Applies the writes recorded since `maps.begin_batch()`. Service ports with a failed write
    /// are then removed one syscall at a time (no half-programmed service stays behind) and the
    /// first failure is returned, naming its Service port.
    pub fn flush(
        &mut self,
        maps: &mut Maps,
        ops: &mut usize,
    ) -> Result<FlushReport, DataplaneError> {
        let mut report = maps.flush();
        if report.failed.is_empty() {
            return Ok(report);
        }
        self.needs_sweep = true;
        let by_object: HashMap<String, ServicePortName> = self
            .services
            .keys()
            .map(|name| (object_name(name), name.clone()))
            .collect();
        for (object, e) in &report.failed {
            tracing::error!("ebpf: {e}");
            let Some(name) = by_object.get(&**object) else {
                continue;
            };
            let old = self.services.remove(name).unwrap_or_default();
            for set in old.sets.values() {
                self.claimed_sets.remove(&set.id);
            }
            // Errors here leave entries the sweep removes.
            let _ = self.remove(maps, name, old, ops);
        }
        Err(report.failed.swap_remove(0).1)
    }

    /// The set ids of a service port, cluster set first (for tests and `proxy inspect`).
    pub fn set_ids(&self, name: &ServicePortName) -> Vec<u32> {
        self.services
            .get(name)
            .map(|s| s.sets.values().map(|set| set.id).collect())
            .unwrap_or_default()
    }
}

/// A trie key as bytes (aya's `Key` is packed and neither `Eq` nor `Hash`).
fn key_bytes(key: &aya::maps::lpm_trie::Key<proxy_common::SrcRangeKey>) -> Vec<u8> {
    let data = key.data();
    let mut out = key.prefix_len().to_ne_bytes().to_vec();
    for w in data.frontend.addr.iter().chain(&data.src) {
        out.extend(w.to_ne_bytes());
    }
    out.extend(data.frontend.port.to_ne_bytes());
    out.extend([data.frontend.proto, data.frontend.scope]);
    out
}

/// A Maglev table's slots as backend ids: `ids[i]` is the id of `addrs[i]`, the set's backends,
/// which are the table's endpoints.
fn maglev_slots(
    table: &crate::maglev::MaglevTable,
    addrs: &[BackendAddr],
    ids: &[u32],
) -> Result<Vec<u32>, DataplaneError> {
    let by_addr: HashMap<std::net::SocketAddr, u32> = addrs
        .iter()
        .map(BackendAddr::socket_addr)
        .zip(ids.iter().copied())
        .collect();
    table
        .slots()
        .map(|ep| {
            by_addr.get(&ep).copied().ok_or_else(|| {
                DataplaneError::Other(format!(
                    "the Maglev table names {ep}, which is not in its backend set"
                ))
            })
        })
        .collect()
}

/// How errors name a service port's map entries.
fn object_name(name: &ServicePortName) -> String {
    format!("Service port {name}")
}

fn slot_key(set_id: u32, slot: usize) -> SlotKey {
    SlotKey {
        set_id,
        slot: slot as u32,
    }
}

fn backend_value(addr: &BackendAddr) -> Backend {
    Backend {
        addr: addr_words(addr.addr),
        port: addr.port.to_be(),
        proto: addr.proto.number(),
        family: family_of(&addr.addr),
    }
}

/// The family constant of a frontend key.
fn key_family(key: &ServiceKey) -> u8 {
    if key_is_v6(key) {
        FAMILY_V6
    } else {
        FAMILY_V4
    }
}

/// The address of a backend map value.
pub fn backend_addr(b: &Backend) -> Option<BackendAddr> {
    let v6 = match b.family {
        FAMILY_V4 => false,
        FAMILY_V6 => true,
        _ => return None,
    };
    let proto = match b.proto {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        132 => Protocol::Sctp,
        _ => return None,
    };
    Some(BackendAddr {
        addr: addr_from_words(b.addr, v6),
        port: u16::from_be(b.port),
        proto,
    })
}
