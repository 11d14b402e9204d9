//! The agent's memory allocator: mimalloc (v2) as the `proxy` binary's global allocator, how it
//! gives memory back, and handing back what a full sync freed. Owns nothing else: no state, no
//! dataplane.
//!
//! Why not the C library's malloc: at 100,000 Services nearly all of the agent's memory is small
//! objects that live as long as their Service (names, ports, endpoint lists, programmed sets),
//! made while the listing's decoded objects, many times their size, come and go. glibc's malloc
//! puts an 8-byte header on each and leaves the holes the transient objects free between them;
//! the agent's resident memory was a third above its live heap (heaptrack). mimalloc keeps each
//! size in pages of its own, without headers, and with its purge delay at zero returns a page to
//! the kernel as soon as it is empty. The allocators and options compared, through the API server,
//! are in docs/BENCHMARKS.md ("the allocator and the last copies"): mimalloc v2 purging at once
//! gave the lowest peak and a first programming no slower; v3, the crate's default, peaked
//! higher than glibc.

/// mimalloc's `mi_option_purge_delay` (`include/mimalloc.h` of v2.3: the enum's sixteenth
/// entry; the Rust bindings name no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc's `mi_option_allow_thp` (the same enum's 38th entry; no constant in the bindings).
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 37;

/// Sets the allocator's options; first thing in `main`.
///
/// Transparent huge pages off, for this process only: mimalloc asks for them
/// (`madvise(MADV_HUGEPAGE)`) on the regions it reserves, and where the kernel grants them on
/// request (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise`, Debian's and many
/// distributions' default) the first touch of a 2 MiB-aligned range makes all 2 MiB resident.
/// Under the soak a small agent's resident memory then rose in steps of megabytes as new ranges
/// were touched (16 MiB of its 22 MiB of heap were huge pages), and a purge of a 64 KiB page
/// inside a huge page gives nothing back until the kernel splits it. The agent's heap is small
/// and its objects long-lived; the TLB gain is not worth that.
pub fn configure() {
    // SAFETY: mi_option_set only stores an option value; any thread, any time.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
    }
    // mimalloc reads the option when it maps memory from now on; the process flag also covers
    // what it mapped before `main` (the kernel checks it at each fault) and any other mapping.
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        tracing::debug!(
            "allocator: transparent huge pages stay on: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Hands the allocator's free memory back to the kernel. After a full sync: the listing's
/// converted objects and the pass's change sets are freed by then.
pub fn trim() {
    // SAFETY: mi_collect only frees and purges what the allocator holds unused.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_are_the_ones_the_agent_sets() {
        // The constants name mimalloc's options: the purge delay's default is 10 ms and huge
        // pages are allowed by default; after `configure` both read 0 (a wrong index would read
        // another option's value), and the process flag is set.
        // SAFETY: reading and setting option values.
        unsafe {
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 10);
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_ALLOW_THP), 1);
            configure();
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 0);
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_ALLOW_THP), 0);
            assert_eq!(libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0), 1);
        }
        trim();
    }
}
