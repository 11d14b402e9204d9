//! Atomic fetch-and-add on map values. The bpfel target has no compare-and-swap, so `core`'s atomic
//! types lack `fetch_add`; the intrinsic lowers to BPF's atomic add (`lock xadd`, with fetch where
//! the result is used, kernel >= 5.12).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

/// Adds `v` to `*p` atomically and returns the previous value.
///
/// # Safety
/// `p` must point to a live, aligned u32 (a map value).
#[inline(always)]
pub unsafe fn fetch_add_u32(p: *mut u32, v: u32) -> u32 {
    // SAFETY: the caller guarantees `p`.
    // SeqCst, not Relaxed: LLVM 22's BPF backend selects the non-fetching `lock xadd` for a
    // relaxed add even when the result is used (the "result" is then the operand); a sequentially
    // consistent add is selected as `atomic_fetch_add`.
    unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::SeqCst }>(p, v) }
}

/// Adds `v` (two's complement: also subtracts) to `*p` atomically.
///
/// # Safety
/// `p` must point to a live, aligned u64 (a map value).
#[inline(always)]
pub unsafe fn add_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p`.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}
