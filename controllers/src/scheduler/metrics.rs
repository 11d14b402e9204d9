//! kube-scheduler's metrics under its names, in the process-wide registry the `/metrics` endpoint
//! serves (`runtime::metrics`): `scheduler_schedule_attempts_total{result,profile}`,
//! `scheduler_scheduling_attempt_duration_seconds{result,profile}`,
//! `scheduler_scheduling_algorithm_duration_seconds`, `scheduler_pending_pods{queue}`,
//! `scheduler_preemption_attempts_total`, `scheduler_preemption_victims`. Owns only the metric
//! values.

use std::sync::{Arc, OnceLock, Weak};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use super::queue::SchedulingQueue;
use crate::runtime::metrics::{add_refresher, with_registry, Refresh};

/// `result` ("scheduled", "unschedulable", "error") and `profile` (schedulerName).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub result: String,
    pub profile: String,
}

/// `queue`: "active", "backoff", "unschedulable", "gated".
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

/// The scheduler's metric families.
pub struct SchedulerMetrics {
    pub schedule_attempts: Family<AttemptLabels, Counter>,
    pub attempt_duration: Family<AttemptLabels, Histogram, fn() -> Histogram>,
    pub algorithm_duration: Histogram,
    pub pending_pods: Family<QueueLabel, Gauge>,
    pub preemption_attempts: Counter,
    pub preemption_victims: Histogram,
}

fn latency() -> Histogram {
    // Upstream's buckets: 1 ms doubling, 15 buckets.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The metrics, registered on first use.
pub fn metrics() -> &'static SchedulerMetrics {
    static M: OnceLock<SchedulerMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = SchedulerMetrics {
            schedule_attempts: Family::default(),
            attempt_duration: Family::new_with_constructor(latency),
            algorithm_duration: latency(),
            pending_pods: Family::default(),
            preemption_attempts: Counter::default(),
            preemption_victims: Histogram::new(exponential_buckets(1.0, 2.0, 7)),
        };
        with_registry(|r| {
            r.register(
                "scheduler_schedule_attempts",
                "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
                m.schedule_attempts.clone(),
            );
            r.register(
                "scheduler_scheduling_attempt_duration_seconds",
                "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
                m.attempt_duration.clone(),
            );
            r.register(
                "scheduler_scheduling_algorithm_duration_seconds",
                "Scheduling algorithm latency in seconds",
                m.algorithm_duration.clone(),
            );
            r.register(
                "scheduler_pending_pods",
                "Number of pending pods, by the queue type. 'active' means number of pods in activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number of pods in unschedulablePods that the scheduler attempted to schedule and failed; 'gated' is the number of unschedulable pods that the scheduler never attempted to schedule because they are gated.",
                m.pending_pods.clone(),
            );
            r.register(
                "scheduler_preemption_attempts",
                "Total preemption attempts in the cluster till now",
                m.preemption_attempts.clone(),
            );
            r.register(
                "scheduler_preemption_victims",
                "Number of selected preemption victims",
                m.preemption_victims.clone(),
            );
        });
        m
    })
}

/// Counts one attempt.
pub fn observe_attempt(result: &str, profile: &str, seconds: f64) {
    let labels = AttemptLabels {
        result: result.to_string(),
        profile: profile.to_string(),
    };
    let m = metrics();
    m.schedule_attempts.get_or_create(&labels).inc();
    m.attempt_duration.get_or_create(&labels).observe(seconds);
}

struct PendingRefresh(Arc<SchedulingQueue>);

impl Refresh for PendingRefresh {
    fn refresh(&self) {
        let p = self.0.with(|q, _| q.pending());
        let m = metrics();
        for (queue, n) in [
            ("active", p.active),
            ("backoff", p.backoff),
            ("unschedulable", p.unschedulable),
            ("gated", p.gated),
        ] {
            m.pending_pods
                .get_or_create(&QueueLabel {
                    queue: queue.to_string(),
                })
                .set(n as i64);
        }
    }
}

/// Keeps `scheduler_pending_pods` current at each scrape while the returned handle lives.
pub fn watch_queue(queue: Arc<SchedulingQueue>) -> Arc<dyn Refresh> {
    let r: Arc<dyn Refresh> = Arc::new(PendingRefresh(queue));
    add_refresher(Arc::downgrade(&r) as Weak<dyn Refresh>);
    r
}
