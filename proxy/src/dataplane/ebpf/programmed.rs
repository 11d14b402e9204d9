//! What the agent has written into the maps, per service port, and the diff that brings one
//! service port from its programmed entries to its desired ones (touching only what differs).
//!
//! Ids: a backend set id per (service port, set kind) and a backend id per endpoint address, both
//! allocated monotonically and never reused while the maps live, so a socket released after its
//! backend was removed cannot decrement somebody else's counter. After a restart, ids are recovered
//! from the pinned maps (same endpoint, same id: least-connection counts survive), and the first
//! full sync sweeps whatever no desired service claimed.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;

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

/// One backend set as programmed: backend ids only. Their addresses are in [`Backends`], once
/// per backend however many sets hold it; at 100,000 service ports a copy of the addresses per
/// set was a tenth of the agent's heap (docs/BENCHMARKS.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SetState {
    id: u32,
    /// Backend ids by slot: one slot per backend, or a Maglev table's slots.
    slots: Box<[u32]>,
    /// The backends the set holds a reference on, one per desired endpoint, when they are not
    /// the slots themselves (a Maglev table repeats each many times; a set whose writing failed
    /// has no slots yet); empty otherwise.
    members: Box<[u32]>,
}

impl SetState {
    /// How many slots the set has in `KPR_SLOTS`.
    fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The backend ids the set holds a reference on (each once per endpoint).
    fn members(&self) -> &[u32] {
        if self.members.is_empty() {
            &self.slots
        } else {
            &self.members
        }
    }
}

/// The backends in the maps: by id, with the number of set memberships holding each, and
/// found by address through a table of ids hashed by their address (so an address is kept once,
/// not as a key beside the id map).
#[derive(Debug, Default)]
struct Backends {
    by_id: HashMap<u32, BackendEntry>,
    by_addr: HashTable<u32>,
    hasher: RandomState,
}

#[derive(Debug, Clone, Copy)]
struct BackendEntry {
    addr: BackendAddr,
    refs: u32,
}

impl Backends {
    /// Takes one more reference on the backend at `addr`, if there is one; its id.
    fn hold(&mut self, addr: &BackendAddr) -> Option<u32> {
        let hash = self.hasher.hash_one(addr);
        let id = *self.by_addr.find(hash, |id| self.by_id[id].addr == *addr)?;
        if let Some(e) = self.by_id.get_mut(&id) {
            e.refs += 1;
        }
        Some(id)
    }

    /// Registers a new backend with one reference.
    fn insert(&mut self, id: u32, addr: BackendAddr) {
        let hash = self.hasher.hash_one(addr);
        self.by_id.insert(id, BackendEntry { addr, refs: 1 });
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        self.by_addr
            .insert_unique(hash, id, |id| hasher.hash_one(by_id[id].addr));
    }

    /// Drops one reference on `id`; returns its address when that was the last one (the
    /// backend is then forgotten).
    fn release(&mut self, id: u32) -> Option<BackendAddr> {
        let e = self.by_id.get_mut(&id)?;
        e.refs -= 1;
        if e.refs > 0 {
            return None;
        }
        let addr = e.addr;
        self.by_id.remove(&id);
        let hash = self.hasher.hash_one(addr);
        if let Ok(entry) = self.by_addr.find_entry(hash, |x| *x == id) {
            entry.remove();
        }
        Some(addr)
    }

    fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_id.keys().copied()
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

    /// The state as kept until the port's next change: exactly its entries.
    fn freeze(self) -> Stored {
        Stored {
            frontends: self.frontends.into_boxed_slice(),
            sets: self.sets.0.into_boxed_slice(),
            vips: self.vips.into_boxed_slice(),
            ranges: self.ranges.into_boxed_slice(),
        }
    }
}

/// A [`SvcState`] as the map keeps it between changes: boxed slices, a word smaller each than a
/// vector, in a table of as many entries as service ports (4 MB at 100,000). Thawed (no copy)
/// when the port changes.
#[derive(Debug, Default)]
struct Stored {
    frontends: Box<[(ServiceKey, ServiceValue)]>,
    sets: Box<[(SetKind, SetState)]>,
    vips: Box<[ServiceKey]>,
    ranges: Box<[SrcRange]>,
}

impl Stored {
    fn thaw(self) -> SvcState {
        SvcState {
            frontends: self.frontends.into_vec(),
            sets: Sets(self.sets.into_vec()),
            vips: self.vips.into_vec(),
            ranges: self.ranges.into_vec(),
        }
    }

    fn sets(&self) -> impl Iterator<Item = &SetState> {
        self.sets.iter().map(|(_, s)| s)
    }
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
    services: HashMap<ServicePortName, Stored>,
    /// The set ids `services` hold, kept with it so that claiming a recovered set id is O(1)
    /// (a scan of every service per new set made a 20,000-Service full sync quadratic).
    claimed_sets: HashSet<u32>,
    backends: Backends,
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
        let old = self
            .services
            .remove(name)
            .map(Stored::thaw)
            .unwrap_or_default();
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
                self.services.insert(name.clone(), new.freeze());
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
        // The old slots (none for a recovered or new set: every slot is written).
        let (id, old_slots, fresh) = match previous {
            Some(s) => (s.id, &*s.slots, false),
            None => match self.recover_set(desired, kind) {
                Some(id) => (id, &[][..], false),
                None => {
                    let id = self.next_set;
                    self.next_set += 1;
                    (id, &[][..], true)
                }
            },
        };
        new.sets.insert(
            kind,
            SetState {
                id,
                ..SetState::default()
            },
        );
        if fresh || (previous.is_none() && maps.rr.get(&id)?.is_none()) {
            maps.rr.put(id, 0, object, ops)?;
        }
        let addrs = desired.set(kind);
        let mut ids = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match self.acquire_backend(maps, object, addr, ops) {
                Ok(bid) => ids.push(bid),
                Err(e) => {
                    // The references taken so far are the set's (no slot is written yet),
                    // for the caller's clean-up.
                    new.sets.get_mut(&kind).expect("registered above").members = ids.into();
                    return Err(e);
                }
            }
        }
        let set = new.sets.get_mut(&kind).expect("registered above");
        match desired.maglev_table(kind) {
            Some(table) if !ids.is_empty() => {
                // Registered before the slots are computed, so that an error releases them.
                set.members = ids.into();
                set.slots = maglev_slots(table, addrs, &set.members)?.into();
            }
            _ => set.slots = ids.into(),
        }
        // Registered before the writes, so that an error deletes exactly the slots written.
        for (slot, bid) in set.slots.iter().enumerate() {
            // Only slots that changed are written: a Maglev table moves few slots per change.
            let unchanged = old_slots.get(slot) == Some(bid);
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
        if let Some(id) = self.backends.hold(addr) {
            return Ok(id);
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
        self.backends.insert(id, *addr);
        Ok(id)
    }

    fn release_set(
        &mut self,
        maps: &mut Maps,
        object: &Arc<str>,
        set: &SetState,
        ops: &mut usize,
    ) -> Result<(), DataplaneError> {
        for &id in set.members() {
            if let Some(addr) = self.backends.release(id) {
                self.released.push((id, backend_value(&addr)));
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
            .flat_map(|s| s.sets().map(|set| (set.id, set.slot_count())))
            .collect();
        let backends: HashSet<u32> = self.backends.ids().collect();
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
            let old = self
                .services
                .remove(name)
                .map(Stored::thaw)
                .unwrap_or_default();
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
            .map(|s| s.sets().map(|set| set.id).collect())
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
