//! A rate-limited work queue with client-go's semantics, which the controllers' correctness leans
//! on:
//!
//! - an item is queued at most once (`dirty`), however often it is added;
//! - an item being processed is never handed to a second worker: adding it meanwhile marks it
//!   dirty and it is queued again when the first worker calls [`WorkQueue::done`];
//! - [`WorkQueue::add_rate_limited`] delays by the larger of the item's exponential backoff
//!   (5 ms doubling to 1,000 s) and an overall token bucket (10 per second, burst 100), as
//!   `DefaultControllerRateLimiter`; [`WorkQueue::forget`] clears the item's backoff.
//!
//! The queue's metrics follow kube-controller-manager's workqueue metrics ([`super::metrics`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::metrics::{self, QueueLabel, Refresh};

/// What a queue can hold.
pub trait Item: Clone + Eq + Hash + Debug + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Debug + Send + Sync + 'static> Item for T {}

/// Per-item exponential backoff: `base * 2^failures`, at most `max`.
#[derive(Debug, Clone)]
pub struct ItemBackoff<T> {
    base: Duration,
    max: Duration,
    failures: HashMap<T, u32>,
}

impl<T: Item> ItemBackoff<T> {
    /// Backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: HashMap::new(),
        }
    }

    /// The delay for this failure of `item`, counting it.
    pub fn when(&mut self, item: &T) -> Duration {
        let n = self.failures.entry(item.clone()).or_insert(0);
        let exp = *n;
        *n = n.saturating_add(1);
        let factor = 2f64.powi(exp.min(64) as i32);
        let delay = self.base.as_secs_f64() * factor;
        if delay > self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(delay)
        }
    }

    /// Failures counted for `item`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.failures.get(item).copied().unwrap_or(0)
    }

    /// Clears `item`'s failures.
    pub fn forget(&mut self, item: &T) {
        self.failures.remove(item);
    }
}

/// An overall token bucket: `qps` tokens a second, at most `burst` saved.
#[derive(Debug, Clone)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self::full_at(qps, burst, Instant::now())
    }

    /// A bucket full at `now` (a clock other than the system's, e.g. tokio's).
    pub fn full_at(qps: f64, burst: u32, now: Instant) -> Self {
        Self {
            qps,
            burst: burst as f64,
            tokens: burst as f64,
            last: now,
        }
    }

    /// Reserves one token at `now` and returns how long until it is available.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// `DefaultControllerRateLimiter`: the larger of the two delays.
#[derive(Debug, Clone)]
pub struct RateLimiter<T> {
    backoff: ItemBackoff<T>,
    bucket: Bucket,
}

impl<T: Item> RateLimiter<T> {
    /// Per-item 5 ms..1,000 s, overall 10 qps with a burst of 100.
    pub fn default_controller() -> Self {
        Self::new(
            ItemBackoff::new(Duration::from_millis(5), Duration::from_secs(1000)),
            Bucket::new(10.0, 100),
        )
    }

    /// A limiter of the two parts.
    pub fn new(backoff: ItemBackoff<T>, bucket: Bucket) -> Self {
        Self { backoff, bucket }
    }

    /// The delay before `item` may be retried.
    pub fn when(&mut self, item: &T) -> Duration {
        let a = self.backoff.when(item);
        let b = self.bucket.reserve(Instant::now());
        a.max(b)
    }
}

/// How long a controller waits after a change of one of its Pods that only moves its status
/// counts (bound, Running, Ready) before it syncs: kwok or a kubelet make a controller's Pods
/// Ready within moments of each other, so the group costs one status write instead of one per
/// Pod (see [`WorkQueue::add_coalesced`]). kube-controller-manager syncs at once and coalesces
/// only while its workers are busy; an accepted difference (docs/WORKLOADS.md).
pub const STATUS_COALESCE: Duration = Duration::from_millis(250);

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    /// When each queued item was added (queue latency).
    added: HashMap<T, Instant>,
    /// When each item in processing was handed out (work duration, unfinished work).
    started: HashMap<T, Instant>,
    /// Items waiting for the end of an [`WorkQueue::add_coalesced`] window.
    coalescing: HashSet<T>,
    shutting_down: bool,
}

/// A deduplicating, rate-limited work queue (see the module documentation).
pub struct WorkQueue<T: Item> {
    name: String,
    state: Mutex<State<T>>,
    limiter: Mutex<RateLimiter<T>>,
    notify: Notify,
    this: Weak<WorkQueue<T>>,
    label: QueueLabel,
}

impl<T: Item> WorkQueue<T> {
    /// A queue named `name` (its metrics' label) with the default controller rate limiter.
    pub fn new(name: &str) -> Arc<Self> {
        Self::with_limiter(name, RateLimiter::default_controller())
    }

    /// A queue with its own rate limiter.
    pub fn with_limiter(name: &str, limiter: RateLimiter<T>) -> Arc<Self> {
        let q = Arc::new_cyclic(|this| WorkQueue {
            name: name.to_string(),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                added: HashMap::new(),
                started: HashMap::new(),
                coalescing: HashSet::new(),
                shutting_down: false,
            }),
            limiter: Mutex::new(limiter),
            notify: Notify::new(),
            this: this.clone(),
            label: QueueLabel {
                name: name.to_string(),
            },
        });
        let refresher: Arc<dyn Refresh> = q.clone();
        metrics::add_refresher(Arc::downgrade(&refresher));
        q
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().expect("work queue lock")
    }

    /// Queues `item` unless it is already queued; an item being processed is queued again when it
    /// is done.
    pub fn add(&self, item: T) {
        let mut s = self.state();
        if s.shutting_down || s.dirty.contains(&item) {
            return;
        }
        metrics::queues().adds.get_or_create(&self.label).inc();
        s.dirty.insert(item.clone());
        if s.processing.contains(&item) {
            return;
        }
        s.added.insert(item.clone(), Instant::now());
        s.queue.push_back(item);
        metrics::queues()
            .depth
            .get_or_create(&self.label)
            .set(s.queue.len() as i64);
        drop(s);
        self.notify.notify_one();
    }

    /// Queues `item` after `after` (at once when zero).
    pub fn add_after(&self, item: T, after: Duration) {
        if after.is_zero() {
            return self.add(item);
        }
        if self.state().shutting_down {
            return;
        }
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            this.add(item);
        });
    }

    /// Queues `item` after `window`, unless it is already waiting for a coalesced add: every
    /// call within one window costs one add at its end. Independent of
    /// [`add_after`](Self::add_after), whose delays are each honoured (a requeue "not before T", such as
    /// minReadySeconds, must not be merged into an earlier one).
    pub fn add_coalesced(&self, item: T, window: Duration) {
        {
            let mut s = self.state();
            if s.shutting_down || !s.coalescing.insert(item.clone()) {
                return;
            }
        }
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            this.state().coalescing.remove(&item);
            this.add(item);
        });
    }

    /// Queues `item` after its rate-limited delay.
    pub fn add_rate_limited(&self, item: T) {
        let after = self.limiter.lock().expect("limiter lock").when(&item);
        metrics::queues().retries.get_or_create(&self.label).inc();
        self.add_after(item, after);
    }

    /// Clears `item`'s backoff (call after a successful sync).
    pub fn forget(&self, item: &T) {
        self.limiter
            .lock()
            .expect("limiter lock")
            .backoff
            .forget(item);
    }

    /// How often `item` has been re-queued with a rate limit since its last `forget`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter
            .lock()
            .expect("limiter lock")
            .backoff
            .num_requeues(item)
    }

    /// Items waiting (not those being processed).
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next item, waiting for one; `None` once the queue is shut down.
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state();
                if let Some(item) = s.queue.pop_front() {
                    let now = Instant::now();
                    if let Some(added) = s.added.remove(&item) {
                        metrics::queues()
                            .queue_duration
                            .get_or_create(&self.label)
                            .observe(now.duration_since(added).as_secs_f64());
                    }
                    metrics::queues()
                        .depth
                        .get_or_create(&self.label)
                        .set(s.queue.len() as i64);
                    s.dirty.remove(&item);
                    s.processing.insert(item.clone());
                    s.started.insert(item.clone(), now);
                    // Another waiter may take the next item.
                    if !s.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(item);
                }
                if s.shutting_down {
                    self.notify.notify_one();
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks `item` processed; if it was added meanwhile it is queued again.
    pub fn done(&self, item: &T) {
        let mut s = self.state();
        s.processing.remove(item);
        if let Some(started) = s.started.remove(item) {
            metrics::queues()
                .work_duration
                .get_or_create(&self.label)
                .observe(started.elapsed().as_secs_f64());
        }
        if s.dirty.contains(item) && !s.shutting_down {
            s.added.insert(item.clone(), Instant::now());
            s.queue.push_back(item.clone());
            metrics::queues()
                .depth
                .get_or_create(&self.label)
                .set(s.queue.len() as i64);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Stops handing out items: every `get` returns `None` from now on.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

impl<T: Item> Refresh for WorkQueue<T> {
    fn refresh(&self) {
        let s = self.state();
        let now = Instant::now();
        let mut total = 0.0;
        let mut longest: f64 = 0.0;
        for started in s.started.values() {
            let d = now.duration_since(*started).as_secs_f64();
            total += d;
            longest = longest.max(d);
        }
        metrics::queues()
            .unfinished_work
            .get_or_create(&self.label)
            .set(total);
        metrics::queues()
            .longest_running
            .get_or_create(&self.label)
            .set(longest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ctl1_items_are_deduplicated_and_requeued_after_done() {
        let q = WorkQueue::<String>::new("test-dedup");
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2, "CTL-1 a key is queued once");
        let a = q.get().await.unwrap();
        assert_eq!(a, "a");
        q.add("a".into());
        assert_eq!(q.len(), 1, "an item being processed is not queued twice");
        q.done(&a);
        assert_eq!(q.len(), 2, "dirty while processing: queued again on done");
        assert_eq!(q.get().await.unwrap(), "b");
        assert_eq!(q.get().await.unwrap(), "a");
    }

    #[tokio::test]
    async fn shut_down_wakes_every_getter() {
        let q = WorkQueue::<u32>::new("test-shutdown");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.get().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        for w in waiters {
            assert_eq!(w.await.unwrap(), None);
        }
    }

    #[test]
    fn ctl1_backoff_doubles_per_item_up_to_the_cap_and_forget_resets() {
        let mut b = ItemBackoff::new(Duration::from_millis(5), Duration::from_secs(1000));
        let delays: Vec<_> = (0..4).map(|_| b.when(&"x")).collect();
        assert_eq!(
            delays,
            [5, 10, 20, 40].map(Duration::from_millis),
            "exponential per item"
        );
        assert_eq!(
            b.when(&"y"),
            Duration::from_millis(5),
            "items are independent"
        );
        assert_eq!(b.num_requeues(&"x"), 4);
        b.forget(&"x");
        assert_eq!(b.when(&"x"), Duration::from_millis(5));
        for _ in 0..40 {
            b.when(&"z");
        }
        assert_eq!(b.when(&"z"), Duration::from_secs(1000), "capped");
    }

    #[test]
    fn ctl1_the_overall_bucket_allows_a_burst_then_qps() {
        let mut bucket = Bucket::new(10.0, 100);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(bucket.reserve(now), Duration::ZERO);
        }
        let d = bucket.reserve(now);
        assert!((d.as_secs_f64() - 0.1).abs() < 1e-6, "{d:?}");
        let d = bucket.reserve(now);
        assert!((d.as_secs_f64() - 0.2).abs() < 1e-6, "{d:?}");
    }

    #[tokio::test]
    async fn metrics_use_upstream_names() {
        let q = WorkQueue::<u32>::new("test-metrics");
        q.add(1);
        let text = metrics::encode();
        assert!(
            text.contains("workqueue_adds_total{name=\"test-metrics\"} 1"),
            "{text}"
        );
        assert!(text.contains("workqueue_depth{name=\"test-metrics\"} 1"));
        let item = q.get().await.unwrap();
        q.done(&item);
        let text = metrics::encode();
        assert!(text.contains("workqueue_work_duration_seconds_count{name=\"test-metrics\"} 1"));
        assert!(text.contains("workqueue_longest_running_processor_seconds{name=\"test-metrics\"}"));
    }

    #[tokio::test]
    async fn coalesced_adds_within_a_window_are_one_and_delayed_adds_stay_independent() {
        let q = WorkQueue::<u32>::new("test-coalesce");
        q.add_coalesced(1, Duration::from_millis(100));
        q.add_coalesced(1, Duration::from_millis(100));
        q.add_after(1, Duration::from_millis(300));
        assert_eq!(q.len(), 0, "nothing before the window ends");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(q.len(), 1, "one add for the window");
        let item = q.get().await.unwrap();
        q.done(&item);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(q.len(), 1, "the delayed add is not merged into the window");
        let item = q.get().await.unwrap();
        q.done(&item);
        q.add_coalesced(1, Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(q.len(), 1, "a new window after the last one ended");
    }
}
