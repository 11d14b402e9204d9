//! The C allocator (glibc's malloc) under the agent: how many arenas it may keep, and handing
//! back to the kernel what a full sync freed. Owns nothing else: no state, no dataplane.
//!
//! Why: glibc gives each thread that allocates under contention an arena of its own (up to eight
//! per core), and memory freed in one arena is found again only by threads using that arena. The
//! agent's listing is decoded and converted on the runtime's workers while the sync builds the
//! programmed state on another thread, so with glibc's default the transient memory of the one
//! was not reused by the other: at 100,000 Services, two arenas lower the peak resident memory
//! by about 18 MiB, the most that any single structure change gave (docs/BENCHMARKS.md, "where
//! the peak goes"). The controller binaries make the same choice (`controllers` crate,
//! `runtime/allocator.rs`).
//!
//! Only glibc targets have these knobs; elsewhere the functions do nothing.

/// The arenas the allocator may keep: the source's decoding and the sync may allocate at once
/// (so one arena would make them wait on each other), and more would keep freed memory where
/// the next allocation does not look.
pub const ARENAS: i32 = 2;

/// Caps the allocator's arenas at [`ARENAS`]. Call it first in `main`, before any thread exists:
/// a thread keeps the arena it was given.
pub fn bound_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Hands the allocator's free pages back to the kernel; true when some were released. After a
/// full sync: the listing's converted objects and the pass's change sets are freed by then, and
/// glibc gives back unprompted only what lies at the top of an arena's heap. It walks each
/// arena's free chunks under its lock (milliseconds at 100,000 Services), so only full syncs
/// call it.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases free memory; it is safe to call from any thread.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes the allocator holds free (`mallinfo2`).
    fn free_bytes() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        unsafe { libc::mallinfo2() }.fordblks
    }

    #[test]
    fn a_trim_gives_freed_memory_back() {
        // 16 MB in small blocks (below the mmap threshold, so they come from an arena), all
        // freed but the last: they lie below a live block, not at the top of the arena's heap,
        // so the allocator keeps them until a trim. Other tests allocate beside this one, hence
        // the margins.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 4000]).collect();
        let last = blocks.pop();
        drop(blocks);
        assert!(
            free_bytes() >= 8 << 20,
            "16 MB freed below a live block stays with the allocator"
        );
        assert!(trim(), "a trim releases the freed pages");
        drop(last);
    }
}
