//! Fault injection for tests: fail requests with 500, stall responses, drop every open watch.
//!
//! Owns only the fault switches; the `http` module consults them on every request.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

#[derive(Debug)]
struct Inner {
    fail_next: AtomicU64,
    fail_until: Mutex<Option<Instant>>,
    stall: Mutex<Option<(Duration, Option<Instant>)>>,
    drop_watches: watch::Sender<u64>,
    requests: AtomicU64,
    forbidden: Mutex<HashSet<String>>,
}

/// A cloneable handle that switches faults on and off while the server runs.
#[derive(Debug, Clone)]
pub struct FaultHandle(Arc<Inner>);

impl Default for FaultHandle {
    fn default() -> Self {
        let (tx, _) = watch::channel(0);
        Self(Arc::new(Inner {
            fail_next: AtomicU64::new(0),
            fail_until: Mutex::new(None),
            stall: Mutex::new(None),
            drop_watches: tx,
            requests: AtomicU64::new(0),
            forbidden: Mutex::new(HashSet::new()),
        }))
    }
}

impl FaultHandle {
    /// Ends every open watch stream now (clients see the stream close and must re-watch).
    pub fn drop_watches(&self) {
        self.0.drop_watches.send_modify(|g| *g += 1);
    }

    /// The next `n` requests answer 500 InternalError.
    pub fn fail_next(&self, n: u64) {
        self.0.fail_next.store(n, Ordering::SeqCst);
    }

    /// Every request answers 500 InternalError for `d` from now.
    pub fn fail_for(&self, d: Duration) {
        *self.0.fail_until.lock().expect("fault lock") = Some(Instant::now() + d);
    }

    /// Every request is delayed by `delay` before it is handled, for `window` from now (None: until
    /// `clear`).
    pub fn stall(&self, delay: Duration, window: Option<Duration>) {
        *self.0.stall.lock().expect("fault lock") =
            Some((delay, window.map(|w| Instant::now() + w)));
    }

    /// Switches every fault off (open watches are not affected).
    pub fn clear(&self) {
        self.0.fail_next.store(0, Ordering::SeqCst);
        *self.0.fail_until.lock().expect("fault lock") = None;
        *self.0.stall.lock().expect("fault lock") = None;
    }

    /// Every request on resource type `plural` (e.g. "nodes") answers 403 Forbidden, as for a client
    /// whose RBAC role lacks it, until `allow`.
    pub fn forbid(&self, plural: &str) {
        self.0
            .forbidden
            .lock()
            .expect("fault lock")
            .insert(plural.to_string());
    }

    /// Undoes `forbid`.
    pub fn allow(&self, plural: &str) {
        self.0.forbidden.lock().expect("fault lock").remove(plural);
    }

    pub(crate) fn is_forbidden(&self, plural: &str) -> bool {
        self.0
            .forbidden
            .lock()
            .expect("fault lock")
            .contains(plural)
    }

    /// Requests received so far (including failed ones).
    pub fn requests(&self) -> u64 {
        self.0.requests.load(Ordering::SeqCst)
    }

    /// Counts the request and says how long to stall it and whether to fail it.
    pub(crate) fn on_request(&self) -> (Option<Duration>, bool) {
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        let now = Instant::now();
        let stall = match *self.0.stall.lock().expect("fault lock") {
            Some((d, until)) if until.is_none_or(|u| now < u) => Some(d),
            _ => None,
        };
        let fail_window = self
            .0
            .fail_until
            .lock()
            .expect("fault lock")
            .is_some_and(|u| now < u);
        let fail_counted = self
            .0
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        (stall, fail_window || fail_counted)
    }

    /// A receiver that changes whenever `drop_watches` is called.
    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.0.drop_watches.subscribe()
    }
}
