//! The controller manager's Prometheus metrics: the work queues' metrics under the names and label
//! kube-controller-manager uses (`workqueue_depth{name="replicaset"}`, `workqueue_adds_total`,
//! `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`, `workqueue_retries_total`,
//! `workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds`), so the
//! dashboards and alerts written for it work unchanged; and the tasks alive in the process's async
//! runtime (`kpr_runtime_alive_tasks`: a task per timer or request that is never finished shows
//! as a rise over a soak). One process-wide registry; [`encode`] renders it in the text
//! exposition format.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The `name` label: which queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue's name (the controller's name, as upstream).
    pub name: String,
}

fn histogram() -> Histogram {
    // Upstream's buckets: 10 ns to 1,000 s, a factor of 10 apart.
    Histogram::new(exponential_buckets(1e-8, 10.0, 12))
}

/// The workqueue metric families.
pub struct QueueMetrics {
    /// Items waiting.
    pub depth: Family<QueueLabel, Gauge>,
    /// Items added.
    pub adds: Family<QueueLabel, Counter>,
    /// Seconds an item waited before being processed.
    pub queue_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    /// Seconds processing an item took.
    pub work_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    /// Rate-limited re-adds.
    pub retries: Family<QueueLabel, Counter>,
    /// Seconds of work in progress not yet observed by `work_duration`.
    pub unfinished_work: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// Seconds the longest-running item has been processed.
    pub longest_running: Family<QueueLabel, Gauge<f64, AtomicU64>>,
}

/// Something refreshed just before each scrape (gauges computed from state, e.g. unfinished work).
pub trait Refresh: Send + Sync {
    /// Updates its gauges.
    fn refresh(&self);
}

struct Global {
    registry: Mutex<Registry>,
    queues: QueueMetrics,
    tasks: Gauge,
    refreshers: Mutex<Vec<Weak<dyn Refresh>>>,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let queues = QueueMetrics {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(histogram),
            work_duration: Family::new_with_constructor(histogram),
            retries: Family::default(),
            unfinished_work: Family::default(),
            longest_running: Family::default(),
        };
        let mut registry = Registry::default();
        let r = &mut registry;
        r.register(
            "workqueue_depth",
            "Current depth of workqueue",
            queues.depth.clone(),
        );
        r.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            queues.adds.clone(),
        );
        r.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            queues.queue_duration.clone(),
        );
        r.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            queues.work_duration.clone(),
        );
        r.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            queues.retries.clone(),
        );
        r.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            queues.unfinished_work.clone(),
        );
        r.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            queues.longest_running.clone(),
        );
        let tasks = Gauge::default();
        r.register(
            "kpr_runtime_alive_tasks",
            "Tasks alive in the process's async runtime (spawned and not finished)",
            tasks.clone(),
        );
        Global {
            registry: Mutex::new(registry),
            queues,
            tasks,
            refreshers: Mutex::new(Vec::new()),
        }
    })
}

/// The workqueue metric families.
pub fn queues() -> &'static QueueMetrics {
    &global().queues
}

/// Registers something to refresh before each scrape (held weakly).
pub fn add_refresher(r: Weak<dyn Refresh>) {
    global().refreshers.lock().expect("metrics lock").push(r);
}

/// Registers more metrics in the process-wide registry.
pub fn with_registry(f: impl FnOnce(&mut Registry)) {
    f(&mut global().registry.lock().expect("metrics lock"));
}

/// Every metric in the text exposition format.
pub fn encode() -> String {
    let g = global();
    let live: Vec<Arc<dyn Refresh>> = {
        let mut refreshers = g.refreshers.lock().expect("metrics lock");
        refreshers.retain(|r| r.strong_count() > 0);
        refreshers.iter().filter_map(Weak::upgrade).collect()
    };
    for r in live {
        r.refresh();
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let alive = runtime.metrics().num_alive_tasks();
        g.tasks.set(i64::try_from(alive).unwrap_or(i64::MAX));
    }
    let mut out = String::new();
    let registry = g.registry.lock().expect("metrics lock");
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("encoding metrics");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive_tasks() -> i64 {
        let text = encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("kpr_runtime_alive_tasks "))
            .expect("kpr_runtime_alive_tasks in the exposition");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// The gauge counts the scraping runtime's unfinished tasks: up while they wait, down once
    /// they end.
    #[tokio::test]
    async fn alive_tasks_follow_the_runtime() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tasks: Vec<_> = (0..5)
            .map(|_| {
                let mut rx = rx.clone();
                tokio::spawn(async move { rx.wait_for(|done| *done).await.map(drop) })
            })
            .collect();
        assert_eq!(alive_tasks(), 5);
        tx.send(true).unwrap();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(alive_tasks(), 0);
    }
}
