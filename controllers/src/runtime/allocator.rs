//! The allocator under the `controller-manager` and `scheduler` binaries: jemalloc, its options
//! (few arenas, a background thread that hands freed pages back to the kernel), purging it now
//! and then, and its own account of the heap on `/metrics`. Owns nothing else: no controller, no
//! scheduling.
//!
//! Why jemalloc and not glibc's malloc: under the soak the controller-manager's live heap stays
//! flat while glibc's heap kept growing by a few tens of KiB a minute for the whole hour, even
//! capped at two arenas and trimmed every minute (docs/RELIABILITY.md, scenario 7): the informer
//! threads decode objects of every size, workers free them in another order, and glibc's
//! best-fit heap grew its top past the holes. jemalloc keeps each size class in slabs of its
//! own, so a freed object's place is taken by the next object of its size, and its background
//! thread purges freed pages after a few seconds (what Go's scavenger does under
//! kube-controller-manager). The agent (`proxy`) has its own allocator (mimalloc,
//! `proxy/src/allocator.rs`), chosen on its own measurements.
//!
//! A binary opts in with [`jemalloc_allocator!`]: the global allocator and its options are
//! items of the binary, so the crates that only link this library (xtask) keep theirs.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::metrics::{add_refresher, with_registry, Refresh};

pub use tikv_jemallocator::Jemalloc;

/// The arenas jemalloc may keep, as its option string says them ([`MALLOC_CONF`]). Two, not
/// jemalloc's four per core: the binaries' threads (informers, workers, the runtime's) allocate
/// briefly and seldom at once, so a second arena keeps them from waiting on each other, and
/// fewer arenas means freed memory is found again by the next allocation instead of sitting in
/// an arena no thread uses. The count does not grow with the node's cores.
pub const ARENAS: usize = 2;

/// jemalloc's options, read once at its start (`_rjem_malloc_conf`, NUL-terminated):
/// [`ARENAS`] arenas, and the background thread that purges freed pages after the decay time
/// (10 s by default) instead of the allocating threads doing it or nobody.
pub const MALLOC_CONF: &[u8] = b"narenas:2,background_thread:true\0";

/// Makes jemalloc the binary's global allocator, with [`MALLOC_CONF`]. Invoke it once, at the
/// top level of a binary's root module.
#[macro_export]
macro_rules! jemalloc_allocator {
    () => {
        #[global_allocator]
        static GLOBAL_ALLOCATOR: $crate::runtime::allocator::Jemalloc =
            $crate::runtime::allocator::Jemalloc;

        /// jemalloc reads its options from this symbol (its `malloc_conf`, with the prefix
        /// tikv-jemalloc-sys gives its symbols) when it starts.
        #[allow(non_upper_case_globals)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        pub static malloc_conf: Option<&'static u8> =
            Some(&$crate::runtime::allocator::MALLOC_CONF[0]);
    };
}

// The library's own tests run on it too, so they check what the binaries get.
#[cfg(test)]
jemalloc_allocator!();

/// The `state` label of `kpr_allocator_heap_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// The allocator's metrics: its heap by state (refreshed at each scrape from jemalloc's
/// statistics) and the purges that released memory.
struct AllocatorMetrics {
    heap: Family<StateLabel, Gauge>,
    trims: Family<ReleasedLabel, Counter>,
}

/// The `released` label of `kpr_allocator_trims_total`: whether a purge gave pages back.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReleasedLabel {
    released: &'static str,
}

impl Refresh for AllocatorMetrics {
    fn refresh(&self) {
        if let Some(h) = heap() {
            for (state, bytes) in [("in_use", h.in_use), ("free", h.free)] {
                self.heap
                    .get_or_create(&StateLabel { state })
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
    }
}

fn metrics() -> &'static Arc<AllocatorMetrics> {
    static METRICS: OnceLock<Arc<AllocatorMetrics>> = OnceLock::new();
    METRICS.get_or_init(|| {
        let m = Arc::new(AllocatorMetrics {
            heap: Family::default(),
            trims: Family::default(),
        });
        with_registry(|r| {
            r.register(
                "kpr_allocator_heap_bytes",
                "The allocator's heap: bytes in use by the program, and bytes resident but not \
                 in use (freed pages not purged yet, partly used slabs, the allocator's own)",
                m.heap.clone(),
            );
            r.register(
                "kpr_allocator_trims",
                "Periodic purges of the allocator's freed pages, by whether they gave pages back \
                 to the kernel",
                m.trims.clone(),
            );
        });
        let weak: std::sync::Weak<dyn Refresh> = Arc::downgrade(&(m.clone() as Arc<dyn Refresh>));
        add_refresher(weak);
        m
    })
}

/// The allocator's heap as it accounts it, every arena summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    /// Bytes handed out and not yet freed (`stats.allocated`).
    pub in_use: u64,
    /// Bytes resident in the allocator's pages but not handed out (`stats.resident` less
    /// `stats.allocated`): freed pages not purged yet, the unused part of slabs, its metadata.
    pub free: u64,
}

/// The allocator's heap now, or `None` when jemalloc is not the one allocating (a binary that
/// did not invoke [`jemalloc_allocator!`]: its statistics then count nothing).
pub fn heap() -> Option<Heap> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The statistics are a snapshot taken at the last epoch: take a new one.
    epoch::advance().ok()?;
    let in_use = stats::allocated::read().ok()? as u64;
    let resident = stats::resident::read().ok()? as u64;
    (in_use > 0).then_some(Heap {
        in_use,
        free: resident.saturating_sub(in_use),
    })
}

/// Purges every arena's freed pages at once (what the background thread does after the decay
/// time); true when the resident memory fell.
pub fn trim() -> bool {
    let before = resident();
    // `arena.<MALLCTL_ARENAS_ALL>.purge` (4096 is jemalloc's MALLCTL_ARENAS_ALL): a void
    // control, no value in or out.
    let name = b"arena.4096.purge\0";
    // SAFETY: a NUL-terminated name and no buffers, as jemalloc's mallctl documents for a void
    // control.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0 && resident() < before
}

fn resident() -> usize {
    let _ = tikv_jemalloc_ctl::epoch::advance();
    tikv_jemalloc_ctl::stats::resident::read().unwrap_or(0)
}

/// Registers the allocator's metrics, then purges every `period` (never when it is zero) until
/// the process ends. The background thread purges too, after the decay time; this bounds what
/// a process keeps when that thread could not be started.
pub async fn trim_every(period: Duration) {
    let m = metrics();
    if heap().is_none() {
        tracing::info!("jemalloc is not this binary's allocator: no allocator metrics, no purges");
        return;
    }
    if period.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let released = if trim() { "true" } else { "false" };
        m.trims.get_or_create(&ReleasedLabel { released }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_runs_with_its_options() {
        assert_eq!(
            tikv_jemalloc_ctl::opt::narenas::read().unwrap() as usize,
            ARENAS
        );
        assert!(tikv_jemalloc_ctl::opt::background_thread::read().unwrap());
        assert_eq!(
            std::str::from_utf8(MALLOC_CONF).unwrap(),
            format!("narenas:{ARENAS},background_thread:true\0"),
            "MALLOC_CONF says ARENAS"
        );
    }

    #[test]
    fn freed_memory_shows_as_free_and_a_purge_gives_it_back() {
        // 16 MB in blocks of one size class, all freed but the last: their slabs are free
        // pages the allocator keeps until a purge (or its decay time, 10 s, well after this).
        // Other tests run beside this one and allocate too, so the bounds leave room for them.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 4000]).collect();
        let last = blocks.pop();
        drop(blocks);
        let freed = heap().expect("jemalloc allocates in this test binary");
        assert!(
            freed.free >= 8 << 20,
            "16 MB freed stays with the allocator until purged: {freed:?}"
        );
        assert!(trim(), "a purge releases the freed pages: {freed:?}");
        let after = heap().expect("jemalloc allocates in this test binary");
        assert!(
            after.free + (8 << 20) <= freed.free,
            "a purge gives back what was freed: {freed:?} then {after:?}"
        );
        drop(last);
    }

    #[test]
    fn the_metrics_show_the_heap_by_state() {
        metrics();
        let text = crate::runtime::metrics::encode();
        for state in ["in_use", "free"] {
            let line = format!("kpr_allocator_heap_bytes{{state=\"{state}\"}} ");
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
    }
}
