//! The C allocator (glibc's malloc) under the `controller-manager` and `scheduler` binaries:
//! how many arenas it may keep, handing freed pages back to the kernel now and then, and its own
//! account of the heap on `/metrics`. Owns nothing else: no controller, no scheduling.
//!
//! Why: under a soak the controller-manager's live heap stays flat (heaptrack) while its resident
//! memory rises by tens of KiB a minute (docs/RELIABILITY.md, scenario 7). glibc gives each new
//! thread that allocates under contention an arena of its own (up to eight per core) and returns
//! a freed chunk to the kernel only from the top of its heap, so memory that informer threads
//! decoded into and workers freed stays resident. Go's runtime, under kube-controller-manager,
//! returns freed pages in the background (its scavenger); [`trim_every`] does the same here with
//! `malloc_trim`, which on glibc releases the free pages inside every arena, and [`bound_arenas`]
//! keeps the arenas few so freed memory is reused instead of spread.
//!
//! Only glibc targets have these knobs; elsewhere the functions do nothing and say so once.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::metrics::{add_refresher, with_registry, Refresh};

/// The arenas the allocator may keep. Two, not glibc's eight per core: the binaries' threads
/// (informers, workers, the runtime's) allocate briefly and seldom at once, so a second arena is
/// enough to keep them from waiting on each other, and fewer arenas means freed memory is found
/// again by the next allocation instead of sitting in an arena no thread uses.
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

/// The `state` label of `kpr_allocator_heap_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// The allocator's metrics: its heap by state (refreshed at each scrape from `mallinfo2`) and
/// the trims that released memory.
struct AllocatorMetrics {
    heap: Family<StateLabel, Gauge>,
    trims: Family<ReleasedLabel, Counter>,
}

/// The `released` label of `kpr_allocator_trims_total`: whether a trim gave pages back.
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
                "The C allocator's heap: bytes in use by the program, and bytes freed but kept \
                 by the allocator (resident until reused or trimmed)",
                m.heap.clone(),
            );
            r.register(
                "kpr_allocator_trims",
                "Periodic malloc_trim calls, by whether they gave pages back to the kernel",
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
    /// Bytes handed out and not yet freed (ordinary chunks plus mmapped ones).
    pub in_use: u64,
    /// Bytes freed and kept by the allocator.
    pub free: u64,
}

/// The allocator's heap now (`mallinfo2`), or `None` where the allocator is not glibc's.
pub fn heap() -> Option<Heap> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics (it takes each arena's lock).
        let m = unsafe { libc::mallinfo2() };
        Some(Heap {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Hands the allocator's free pages back to the kernel once; true when some were released.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases free memory; it is safe to call from any thread.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Registers the allocator's metrics, then trims every `period` (never when it is zero) until
/// the process ends. A trim walks each arena's free chunks under its lock: well under a
/// millisecond at these binaries' heap sizes, once a minute by default.
pub async fn trim_every(period: Duration) {
    let m = metrics();
    if heap().is_none() {
        tracing::info!("the allocator is not glibc's: no allocator metrics and no trimming");
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
    fn freed_memory_shows_as_free_and_a_trim_gives_it_back() {
        // 16 MB in small blocks (below the mmap threshold, so they come from an arena), all
        // freed but the last: the freed ones lie below a live block, not at the top of the
        // arena's heap, so the allocator keeps them until a trim. Other tests run beside this
        // one and allocate too, so the bounds leave room for them.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 4000]).collect();
        let last = blocks.pop();
        drop(blocks);
        let freed = heap().expect("glibc's allocator on this target");
        assert!(
            freed.free >= 8 << 20,
            "16 MB freed below a live block stays with the allocator: {freed:?}"
        );
        assert!(trim(), "a trim releases the freed pages: {freed:?}");
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
