//! The pending evictions (upstream's `TimedWorkerQueue`): one per Pod key, each a timer that
//! runs the eviction at its time, or at once when that time has come.
//!
//! Owns the timers and nothing else: what an eviction does is the callback's. An eviction made
//! with a time already past runs at once and cannot be cancelled (upstream keeps no timer for
//! it, so cancelling it reports nothing to cancel); a waiting one is cancelled by aborting its
//! timer. Once it has run, the entry goes; one added while another is pending for the key is
//! ignored, as upstream's `AddWork`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Instant;

use tokio::task::AbortHandle;

/// One pending eviction.
enum Entry {
    /// A timer waits for the eviction's time.
    Waiting {
        id: u64,
        created_at: Instant,
        timer: AbortHandle,
    },
    /// Its time came: the eviction is running.
    Running { id: u64 },
}

impl Entry {
    fn id(&self) -> u64 {
        match self {
            Entry::Waiting { id, .. } | Entry::Running { id } => *id,
        }
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    next_id: u64,
}

/// The pending evictions, by Pod key (`namespace/name`).
#[derive(Default)]
pub struct Evictions {
    state: Mutex<State>,
}

impl Evictions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the eviction waiting for `key` was made (`None` when none waits, or it is running).
    pub fn waiting_since(&self, key: &str) -> Option<Instant> {
        match self.state().entries.get(key) {
            Some(Entry::Waiting { created_at, .. }) => Some(*created_at),
            _ => None,
        }
    }

    /// Whether an eviction is pending for `key`, waiting or running.
    pub fn is_pending(&self, key: &str) -> bool {
        self.state().entries.contains_key(key)
    }

    /// Cancels the eviction pending for `key`: `true` when one was waiting (its timer stopped),
    /// `false` when none was or it was already running (`CancelWork`).
    pub fn cancel(&self, key: &str) -> bool {
        match self.state().entries.remove(key) {
            Some(Entry::Waiting { timer, .. }) => {
                timer.abort();
                true
            }
            _ => false,
        }
    }

    /// Runs `evict` for `key` at `fire_at` (at once when that has come), unless an eviction is
    /// pending for `key` already (`AddWork`). `evict` gets a guard to call [`Self::finish`]
    /// with when it is done. Must be called within a tokio runtime.
    pub fn add<F, Fut>(
        self: &std::sync::Arc<Self>,
        key: &str,
        created_at: Instant,
        fire_at: Instant,
        evict: F,
    ) where
        F: FnOnce(u64) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut state = self.state();
        if state.entries.contains_key(key) {
            return;
        }
        state.next_id += 1;
        let id = state.next_id;
        let now = Instant::now();
        if fire_at <= now {
            state.entries.insert(key.to_string(), Entry::Running { id });
            tokio::spawn(evict(id));
            return;
        }
        let this = std::sync::Arc::downgrade(self);
        let owned_key = key.to_string();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(fire_at)).await;
            let Some(this) = this.upgrade() else { return };
            {
                let mut state = this.state();
                match state.entries.get(&owned_key) {
                    Some(e) if e.id() == id => {
                        state.entries.insert(owned_key, Entry::Running { id });
                    }
                    // Cancelled (or replaced) while the timer fired.
                    _ => return,
                }
            }
            evict(id).await;
        });
        state.entries.insert(
            key.to_string(),
            Entry::Waiting {
                id,
                created_at,
                timer: timer.abort_handle(),
            },
        );
    }

    /// The eviction `id` of `key` is done: its entry goes (unless a newer one took its place).
    pub fn finish(&self, key: &str, id: u64) {
        let mut state = self.state();
        if state.entries.get(key).is_some_and(|e| e.id() == id) {
            state.entries.remove(key);
        }
    }

    /// How many evictions are pending.
    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Evictions {
    /// The controller is gone (leadership lost): no waiting eviction may fire.
    fn drop(&mut self) {
        for e in self.state().entries.values() {
            if let Entry::Waiting { timer, .. } = e {
                timer.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_eviction_fires_once_and_a_cancelled_one_never() {
        let ev = Arc::new(Evictions::default());
        let fired = Arc::new(AtomicU32::new(0));
        let now = Instant::now();
        let soon = now + Duration::from_millis(50);
        for key in ["ns/a", "ns/b"] {
            let (ev2, fired2, k) = (ev.clone(), fired.clone(), key.to_string());
            ev.add(key, now, soon, move |id| async move {
                fired2.fetch_add(1, Ordering::SeqCst);
                ev2.finish(&k, id);
            });
        }
        // A second add while one waits is ignored.
        ev.add("ns/a", now, now, |_| async {
            panic!("a second eviction ran")
        });
        assert_eq!(ev.waiting_since("ns/a"), Some(now));
        assert!(ev.cancel("ns/b"), "a waiting eviction is cancelled");
        assert!(!ev.cancel("ns/b"), "and only once");
        for _ in 0..100 {
            if ev.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(ev.is_empty(), "the fired eviction finished");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 1, "only ns/a fired");
    }

    #[tokio::test]
    async fn an_eviction_due_now_runs_at_once_and_cannot_be_cancelled() {
        let ev = Arc::new(Evictions::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let now = Instant::now();
        ev.add("ns/p", now, now, move |_| async move {
            let _ = rx.await;
        });
        assert!(ev.is_pending("ns/p"));
        assert_eq!(ev.waiting_since("ns/p"), None, "running, not waiting");
        assert!(
            !ev.cancel("ns/p"),
            "nothing waited: no cancellation to report"
        );
        drop(tx);
    }
}
