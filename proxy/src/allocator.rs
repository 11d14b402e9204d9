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

/// Sets the allocator's options; first thing in `main`.
pub fn configure() {
    // SAFETY: mi_option_set only stores an option value; any thread, any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
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
    fn the_purge_delay_is_the_option_the_agent_sets() {
        // The constant names mimalloc's option: its default is 10 ms, and after `configure` it
        // reads 0 (a wrong index would read another option's value).
        // SAFETY: reading and setting option values.
        unsafe {
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 10);
            configure();
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 0);
        }
        trim();
    }
}
