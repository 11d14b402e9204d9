//! Backend choice for one new connection: session affinity, round-robin, least-connection, Maglev.
//! The backend set itself (and a Maglev set's table) was chosen by userspace; this only executes
//! the algorithm over it.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use proxy_common::{
    hash::slot_of, AffinityKey, AffinityValue, BackendCounters, ServiceValue, SlotKey,
    ALG_LEAST_CONN, ALG_MAGLEV, SVC_F_AFFINITY,
};

use crate::atomic;
use crate::maps::{KPR_AFFINITY, KPR_BACKENDS, KPR_COUNTERS, KPR_RR, KPR_SLOTS};

/// Least-connection looks at no more than this many slots (starting at the round-robin cursor).
pub const MAX_LC_SCAN: u32 = 128;

/// Picks a backend id for a new connection of `client` to the set of `svc`; `flow_hash` is the
/// connection's flow hash (`proxy_common::hash`), which only Maglev reads.
#[inline(always)]
pub fn pick(svc: &ServiceValue, client: &AffinityKey, flow_hash: u32) -> Option<u32> {
    if svc.count == 0 {
        return None;
    }
    let affine = svc.flags & SVC_F_AFFINITY != 0;
    if affine {
        if let Some(id) = sticky(svc, client) {
            return Some(id);
        }
    }
    let id = if svc.algorithm == ALG_LEAST_CONN {
        least_conn(svc)?
    } else if svc.algorithm == ALG_MAGLEV {
        // The set's `count` slots are its Maglev table: one lookup, no cursor, no loop.
        slot(svc.set_id, slot_of(flow_hash, svc.count))?
    } else {
        round_robin(svc)?
    };
    if affine {
        let value = AffinityValue {
            backend_id: id,
            _pad: 0,
            last_used_ns: now_ns(),
        };
        // Affinity is best effort: a full LRU evicts, it never fails the insert for lack of room.
        let _ = KPR_AFFINITY.insert(client, value, 0);
    }
    Some(id)
}

/// The backend `client` used within the affinity timeout, if it still exists.
#[inline(always)]
fn sticky(svc: &ServiceValue, client: &AffinityKey) -> Option<u32> {
    let entry = KPR_AFFINITY.get_ptr_mut(client)?;
    // SAFETY: a map value pointer returned by the kernel is valid for the program's run.
    let entry = unsafe { &mut *entry };
    let now = now_ns();
    let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    if now.wrapping_sub(entry.last_used_ns) > timeout_ns {
        return None;
    }
    KPR_BACKENDS.get_ptr(entry.backend_id)?;
    entry.last_used_ns = now;
    Some(entry.backend_id)
}

/// The next slot of the set's cursor (shared by every CPU, so the rotation is exact).
#[inline(always)]
fn next_cursor(set_id: u32) -> Option<u32> {
    let cursor = KPR_RR.get_ptr_mut(set_id)?;
    // SAFETY: map values are 4-byte aligned u32s that live as long as the map.
    Some(unsafe { atomic::fetch_add_u32(cursor, 1) })
}

#[inline(always)]
fn slot(set_id: u32, slot: u32) -> Option<u32> {
    let key = SlotKey { set_id, slot };
    // SAFETY: the value is a plain u32 copied out at once.
    unsafe { KPR_SLOTS.get(key).copied() }
}

#[inline(always)]
fn round_robin(svc: &ServiceValue) -> Option<u32> {
    let cursor = next_cursor(svc.set_id)?;
    slot(svc.set_id, cursor % svc.count)
}

/// The backend with the fewest active connections; ties go to the first one at or after the
/// round-robin cursor, so equal backends still rotate.
#[inline(always)]
fn least_conn(svc: &ServiceValue) -> Option<u32> {
    let start = next_cursor(svc.set_id)?;
    let count = svc.count;
    // A plain u32 (backend ids start at 1, so 0 is "none"), not an Option: LLVM reads an
    // Option's payload even when it is None, and kernels before about 6.2 reject that read of an
    // uninitialised stack slot ("invalid read from stack").
    let mut best: u32 = 0;
    let mut best_active = u64::MAX;
    let mut i = 0u32;
    while i < MAX_LC_SCAN && i < count {
        let slot_no = start.wrapping_add(i) % count;
        if let Some(id) = slot(svc.set_id, slot_no) {
            let active = active_of(id);
            if active < best_active {
                best_active = active;
                best = id;
            }
        }
        i += 1;
    }
    (best != 0).then_some(best)
}

#[inline(always)]
fn active_of(id: u32) -> u64 {
    match KPR_COUNTERS.get_ptr(id) {
        // SAFETY: a plain read of a counter that other CPUs update atomically.
        Some(c) => unsafe { core::ptr::read_volatile(&(*c).active) },
        None => 0,
    }
}

/// Counts a new connection to `id`; `active` only when the socket's release will be seen.
#[inline(always)]
pub fn count_connection(id: u32, active: bool) {
    if let Some(c) = KPR_COUNTERS.get_ptr_mut(id) {
        let c: *mut BackendCounters = c;
        // SAFETY: 8-byte aligned u64 fields of a map value, updated only atomically.
        unsafe {
            atomic::add_u64(&raw mut (*c).total, 1);
            if active {
                atomic::add_u64(&raw mut (*c).active, 1);
            }
        }
    }
}

/// Undoes the `active` count of a released socket.
#[inline(always)]
pub fn release_connection(id: u32) {
    if let Some(c) = KPR_COUNTERS.get_ptr_mut(id) {
        let c: *mut BackendCounters = c;
        // SAFETY: as in `count_connection`.
        unsafe {
            let active = &raw mut (*c).active;
            // Never wrap below zero (a counter recreated after the socket was counted).
            if core::ptr::read_volatile(active) > 0 {
                atomic::add_u64(active, u64::MAX);
            }
        }
    }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}
