//! How a controller runs once built, as each of upstream's controllers' `Run`: wait until the
//! caches it reads have synced ([`wait_for_caches`], client-go's `WaitForNamedCacheSync`), then N
//! workers drain its work queue (CTL-1, CTL-2): each takes a key, runs the controller's sync for
//! it, `forget`s the key on success and re-queues it rate-limited on error. A sync that panics
//! counts as an error (the key is retried, the worker goes on), as upstream's workers are restarted
//! after a crash. [`run_controller`] is the whole of it for a controller with one queue of keys
//! synced by its [`SyncKey`]; one with more queues or work before its workers calls the parts
//! ([`wait_for_caches`], [`run_key_workers`], [`run_workers_of`]).

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt as _;

use super::cache::Indexed;
use super::queue::{Item, WorkQueue};
use crate::helpers::clock::{Clock, SystemClock};

/// The settings of a controller whose only setting is its workers (its `--concurrent-*-syncs`,
/// `DEFAULT` unless set): each such controller's `Config` is this type with its own default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkersConfig<const DEFAULT: usize> {
    /// Concurrent syncs.
    pub workers: usize,
}

impl<const DEFAULT: usize> Default for WorkersConfig<DEFAULT> {
    fn default() -> Self {
        Self { workers: DEFAULT }
    }
}

/// The settings of a controller creating Pods in bursts (ReplicaSet, DaemonSet): its workers
/// (`--concurrent-*-syncs`, `WORKERS` unless set) and the creations or deletions one sync makes
/// at most (upstream's `BurstReplicas`, `BURST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstConfig<const WORKERS: usize, const BURST: usize> {
    /// Concurrent syncs.
    pub workers: usize,
    /// Creations or deletions per sync.
    pub burst_replicas: usize,
}

impl<const WORKERS: usize, const BURST: usize> Default for BurstConfig<WORKERS, BURST> {
    fn default() -> Self {
        Self {
            workers: WORKERS,
            burst_replicas: BURST,
        }
    }
}

/// The settings of a controller that reads the time (Job, CronJob, TTL-after-finished): its
/// workers (each one's `--concurrent-*-syncs`, 5 by default for all three as upstream) and where
/// time comes from (a fake clock in tests).
#[derive(Clone)]
pub struct TimedConfig {
    /// Concurrent syncs.
    pub workers: usize,
    /// Where time comes from.
    pub clock: Arc<dyn Clock>,
}

impl Default for TimedConfig {
    fn default() -> Self {
        Self {
            workers: 5,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for TimedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedConfig")
            .field("workers", &self.workers)
            .finish()
    }
}

/// A cache a controller waits for before its workers start.
pub trait Synced: Send + Sync {
    /// Resolves once the cache holds its first full list.
    fn synced(&self) -> BoxFuture<'_, ()>;
}

impl<K: kube::ResourceExt + Clone + Send + Sync + 'static> Synced for Indexed<K> {
    fn synced(&self) -> BoxFuture<'_, ()> {
        self.wait_ready().boxed()
    }
}

/// Waits until every one of `caches` has synced, logging before and after under the
/// controller's name (client-go's `WaitForNamedCacheSync`).
pub async fn wait_for_caches(controller: &str, caches: &[&dyn Synced]) {
    tracing::info!(controller, "waiting for caches to sync");
    for cache in caches {
        cache.synced().await;
    }
    tracing::info!(controller, "caches are synced");
}

/// A controller's sync of one key of its work queue (upstream's `syncHandler`): what its workers
/// call for each key ([`run_controller`], [`run_key_workers`]).
pub trait SyncKey: Send + Sync + 'static {
    /// Brings the object `key` names (`namespace/name`, or a name) to its desired state; an
    /// error re-queues the key rate-limited.
    fn sync(&self, key: &str) -> impl Future<Output = crate::Result<()>> + Send;
}

/// A controller's whole run: waits for `caches`, then runs `workers` workers calling the
/// controller's [`SyncKey::sync`] for each key of `queue`, until the queue is shut down (or this
/// future is dropped: leadership lost).
pub async fn run_controller<C: SyncKey>(
    controller: &Arc<C>,
    name: &str,
    caches: &[&dyn Synced],
    queue: &Arc<WorkQueue<String>>,
    workers: usize,
) {
    run_controller_with(controller, name, caches, queue, workers, sync_key).await;
}

/// [`run_controller`] with the workers calling `sync(controller, key)` instead of the
/// controller's [`SyncKey::sync`].
pub async fn run_controller_with<C, T, F, Fut>(
    controller: &Arc<C>,
    name: &str,
    caches: &[&dyn Synced],
    queue: &Arc<WorkQueue<T>>,
    workers: usize,
    sync: F,
) where
    C: Send + Sync + 'static,
    T: Item,
    F: Fn(Arc<C>, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = crate::Result<()>> + Send + 'static,
{
    wait_for_caches(name, caches).await;
    tracing::info!(controller = name, workers, "controller started");
    run_workers_of(controller, queue, workers, sync).await;
}

/// Runs `workers` workers over `queue`, calling the controller's [`SyncKey::sync`] for each key.
pub async fn run_key_workers<C: SyncKey>(
    controller: &Arc<C>,
    queue: &Arc<WorkQueue<String>>,
    workers: usize,
) {
    run_workers_of(controller, queue, workers, sync_key).await;
}

/// The end of the run of a controller with work of its own between its caches and its workers:
/// logs `<name> controller started` with the worker count, then runs [`run_key_workers`].
pub async fn start_key_workers<C: SyncKey>(
    controller: &Arc<C>,
    name: &str,
    queue: &Arc<WorkQueue<String>>,
    workers: usize,
) {
    tracing::info!(workers, "{name} controller started");
    run_key_workers(controller, queue, workers).await;
}

/// One worker's call of [`SyncKey::sync`].
async fn sync_key<C: SyncKey>(controller: Arc<C>, key: String) -> crate::Result<()> {
    controller.sync(&key).await
}

/// Runs `workers` workers over `queue`, calling `sync(controller, item)` for each item (the
/// controller's clone handed to every call).
pub async fn run_workers_of<C, T, F, Fut>(
    controller: &Arc<C>,
    queue: &Arc<WorkQueue<T>>,
    workers: usize,
    sync: F,
) where
    C: Send + Sync + 'static,
    T: Item,
    F: Fn(Arc<C>, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = crate::Result<()>> + Send + 'static,
{
    let controller = controller.clone();
    run_workers(queue.clone(), workers, move |item| {
        sync(controller.clone(), item)
    })
    .await;
}

/// Runs `workers` workers over `queue` until it is shut down.
pub async fn run_workers<T, F, Fut>(queue: Arc<WorkQueue<T>>, workers: usize, sync: F)
where
    T: Item,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = crate::Result<()>> + Send + 'static,
{
    let sync = Arc::new(sync);
    let mut tasks = Vec::new();
    for _ in 0..workers.max(1) {
        let queue = queue.clone();
        let sync = sync.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(item) = queue.get().await {
                let outcome = std::panic::AssertUnwindSafe(sync(item.clone()))
                    .catch_unwind()
                    .await;
                match outcome {
                    Ok(Ok(())) => queue.forget(&item),
                    Ok(Err(e)) => {
                        tracing::warn!(queue = queue.name(), ?item, "sync failed, retrying: {e}");
                        queue.add_rate_limited(item.clone());
                    }
                    Err(_) => {
                        tracing::error!(queue = queue.name(), ?item, "sync panicked, retrying");
                        queue.add_rate_limited(item.clone());
                    }
                }
                queue.done(&item);
            }
        }));
    }
    // Dropping this future (leadership lost) stops the workers.
    let _abort = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    for t in tasks {
        let _ = t.await;
    }
}

/// Aborts the tasks when dropped.
pub struct AbortOnDrop(pub Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn ctl1_errors_are_retried_with_backoff_and_success_forgets() {
        let q = WorkQueue::<&'static str>::new("test-workers");
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let runner = tokio::spawn(run_workers(q.clone(), 2, move |item: &'static str| {
            let c = c.clone();
            async move {
                let n = c.fetch_add(1, Ordering::SeqCst);
                match (item, n) {
                    (_, 0) => Err(crate::Error::Invalid {
                        object: "key".into(),
                        reason: "fail once".into(),
                    }),
                    (_, 1) => panic!("and panic once"),
                    _ => Ok(()),
                }
            }
        }));
        q.add("key");
        for _ in 0..200 {
            if calls.load(Ordering::SeqCst) >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.num_requeues(&"key"), 0, "success forgets the backoff");
        q.shut_down();
        runner.await.unwrap();
    }
}
