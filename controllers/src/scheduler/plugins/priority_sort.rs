//! PrioritySort, the default QueueSort plugin: higher `spec.priority` first, then the Pod that
//! entered the queue earlier (upstream's queuesort.PrioritySort). Owns only the ordering.

use crate::scheduler::framework::{Plugin, QueueSortPlugin, QueuedPodInfo};

pub const NAME: &str = "PrioritySort";

/// Orders the active queue by priority, then queue timestamp.
#[derive(Debug, Default)]
pub struct PrioritySort;

impl PrioritySort {
    /// PrioritySort takes no args.
    pub fn new() -> Self {
        PrioritySort
    }
}

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        NAME
    }
}

fn priority(p: &QueuedPodInfo) -> i32 {
    p.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

impl QueueSortPlugin for PrioritySort {
    fn less(&self, a: &QueuedPodInfo, b: &QueuedPodInfo) -> bool {
        let (pa, pb) = (priority(a), priority(b));
        pa > pb || (pa == pb && a.timestamp < b.timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn info(priority: Option<i32>, at: Instant) -> QueuedPodInfo {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": [], "priority": priority}
        }))
        .unwrap();
        QueuedPodInfo {
            pod: Arc::new(pod),
            timestamp: at,
            attempts: 0,
            unschedulable_plugins: Default::default(),
        }
    }

    #[test]
    fn priority_then_queue_time() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let cases = [
            (
                "higher priority first",
                info(Some(10), t1),
                info(Some(1), t0),
                true,
            ),
            (
                "lower priority after",
                info(Some(1), t0),
                info(Some(10), t1),
                false,
            ),
            (
                "equal priority: earlier first",
                info(Some(5), t0),
                info(Some(5), t1),
                true,
            ),
            (
                "equal priority: later after",
                info(Some(5), t1),
                info(Some(5), t0),
                false,
            ),
            (
                "no priority counts as 0",
                info(None, t0),
                info(Some(-1), t1),
                true,
            ),
            (
                "same pod is not less than itself",
                info(None, t0),
                info(None, t0),
                false,
            ),
        ];
        for (name, a, b, want) in cases {
            assert_eq!(PrioritySort.less(&a, &b), want, "{name}");
        }
    }
}
