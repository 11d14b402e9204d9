//! The replica calculation for resource metrics (upstream's `replica_calculator.go` and
//! `metrics/utilization.go`): from the Pods a target's scale selects and their usage in the
//! resource metrics API, the replica count that brings the average to the target, as a
//! utilization (percent of the Pods' requests) or as an average value.
//!
//! The rules, as upstream's:
//! - Pods being deleted and Failed Pods are ignored; Pending Pods are unready;
//! - for CPU, a Pod is unready when it has no Ready condition or start time, when within
//!   `--horizontal-pod-autoscaler-cpu-initialization-period` of its start it is not Ready or its
//!   sample was taken less than one metric window after its last readiness transition, and after
//!   that period when it is not Ready and became so within
//!   `--horizontal-pod-autoscaler-initial-readiness-delay` of its start (it never was ready);
//! - a Pod without a metric is missing; on a scale-down it is taken to use 100 % of its request
//!   (or the target, if above 100 %), on a scale-up 0 %;
//! - unready Pods count as using 0 % only on a scale-up;
//! - within the tolerance (`--horizontal-pod-autoscaler-tolerance`, 0.1) of the target nothing
//!   changes, nor when filling in the missing and unready Pods reverses the direction.
//!
//! Owns the arithmetic only: no I/O, the time is an argument.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::helpers::containers::long_running;
use crate::helpers::quantity::parse_milli;
use crate::runtime::cached_pod::CachedPod;

/// One Pod's usage of a resource, from the resource metrics API.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMetric {
    /// Milli-units (millicores, milli-bytes).
    pub value: i64,
    /// When the sample was taken (the end of its window).
    pub timestamp: Timestamp,
    /// The window the sample averages over.
    pub window: Duration,
}

/// Usage by Pod name.
pub type PodMetrics = BTreeMap<String, PodMetric>;

/// How far from 1 the usage ratio may be before the replica count changes, per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Below 1.
    pub scale_down: f64,
    /// Above 1.
    pub scale_up: f64,
}

impl Tolerances {
    /// The same tolerance both ways (the flag's).
    pub fn both(t: f64) -> Self {
        Self {
            scale_down: t,
            scale_up: t,
        }
    }

    fn within(self, ratio: f64) -> bool {
        (1.0 - self.scale_down) <= ratio && ratio <= (1.0 + self.scale_up)
    }
}

/// What the readiness rules need besides the Pods and metrics.
#[derive(Debug, Clone, Copy)]
pub struct Readiness {
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 min).
    pub cpu_initialization_period: Duration,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 s).
    pub initial_readiness_delay: Duration,
    /// Now.
    pub now: Timestamp,
}

/// The outcome of a utilization calculation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    /// The proposed replica count.
    pub replicas: i32,
    /// The Pods' usage in percent of their requests.
    pub utilization: i32,
    /// Their average usage, milli-units.
    pub raw_average: i64,
}

/// The outcome of an average-value calculation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AverageValue {
    /// The proposed replica count.
    pub replicas: i32,
    /// The Pods' average usage, milli-units.
    pub average: i64,
}

/// How the Pods fall for one calculation.
struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(t)
}

/// What both replica calculations answer when every Pod with a metric was left out.
const NO_READY_METRICS: &str = "did not receive metrics for targeted pods (pods might be unready)";

/// Upstream's `groupPods`: the selected Pods (none is an error, as in both of upstream's
/// callers) sorted into ready, unready, ignored and missing a metric.
fn group_pods(
    pods: &[&CachedPod],
    metrics: &PodMetrics,
    resource: &str,
    r: &Readiness,
) -> Result<Groups, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".to_string());
    }
    let mut g = Groups {
        ready: 0,
        unready: BTreeSet::new(),
        missing: BTreeSet::new(),
        ignored: BTreeSet::new(),
    };
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() || pod.phase() == "Failed" {
            g.ignored.insert(name);
            continue;
        }
        if pod.phase() == "Pending" {
            g.unready.insert(name);
            continue;
        }
        let Some(metric) = metrics.get(&name) else {
            g.missing.insert(name);
            continue;
        };
        if resource == "cpu" {
            let status = pod.status.as_ref();
            let condition = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
            let start = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            let unready = match (condition, start) {
                (Some(c), Some(start)) => {
                    let transition = c
                        .last_transition_time
                        .as_ref()
                        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
                    let not_ready = c.status == "False";
                    if add(start, r.cpu_initialization_period) > r.now {
                        not_ready || metric.timestamp < add(transition, metric.window)
                    } else {
                        not_ready && add(start, r.initial_readiness_delay) > transition
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(name);
                continue;
            }
        }
        g.ready += 1;
    }
    Ok(g)
}

/// Each Pod's request of `resource` in milli-units (upstream's `calculateRequests`): the
/// Pod-level request when the Pod sets Pod-level requests and no container is named, else the
/// sum over its containers and restartable init containers (or the named container alone). A
/// container without the request is an error naming it.
pub fn pod_requests(
    pods: &[&CachedPod],
    container: &str,
    resource: &str,
) -> Result<BTreeMap<String, i64>, String> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            out.insert(name, 0);
            continue;
        };
        let pod_level = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .filter(|r| r.contains_key("cpu") || r.contains_key("memory"));
        if let (Some(requests), "") = (pod_level, container) {
            let q = requests
                .get(resource)
                .ok_or_else(|| format!("missing pod-level request for {resource} in Pod {name}"))?;
            out.insert(name, parse_milli(&q.0).unwrap_or(0));
            continue;
        }
        let mut sum = 0i64;
        for c in long_running(&spec.containers, spec.init_containers.as_ref()) {
            if !container.is_empty() && container != c.name {
                continue;
            }
            let q = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .ok_or_else(|| {
                    format!(
                        "missing request for {resource} in container {} of Pod {name}",
                        c.name
                    )
                })?;
            sum += parse_milli(&q.0).unwrap_or(0);
        }
        out.insert(name, sum);
    }
    Ok(out)
}

/// Upstream's `GetResourceUtilizationRatio`: (ratio to the target, utilization in percent,
/// average raw usage) over the Pods that have both a metric and a request.
pub fn utilization_ratio(
    metrics: &PodMetrics,
    requests: &BTreeMap<String, i64>,
    target: i32,
) -> Result<(f64, i32, i64), String> {
    let (mut total, mut requested, mut n) = (0i64, 0i64, 0i64);
    for (pod, m) in metrics {
        let Some(request) = requests.get(pod) else {
            continue;
        };
        total += m.value;
        requested += request;
        n += 1;
    }
    if requested == 0 {
        return Err("no metrics returned matched known pods".to_string());
    }
    let utilization = ((total * 100) / requested) as i32;
    Ok((
        f64::from(utilization) / f64::from(target),
        utilization,
        total / n,
    ))
}

/// Upstream's `GetMetricUsageRatio`: (ratio to the target, average usage).
fn usage_ratio(metrics: &PodMetrics, target: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|m| m.value).sum();
    let average = total / metrics.len().max(1) as i64;
    (average as f64 / target as f64, average)
}

fn zeroed(at: &PodMetrics) -> PodMetric {
    let any = at.values().next();
    PodMetric {
        value: 0,
        timestamp: any.map_or(Timestamp::UNIX_EPOCH, |m| m.timestamp),
        window: any.map_or(Duration::ZERO, |m| m.window),
    }
}

fn with_value(template: &PodMetric, value: i64) -> PodMetric {
    PodMetric {
        value,
        ..template.clone()
    }
}

fn ceil_replicas(ratio: f64, pods: usize) -> i32 {
    (ratio * pods as f64).ceil() as i32
}

/// The replica count for a utilization target (upstream's `GetResourceReplicas`), `metrics`
/// being what the resource metrics API returned for the selector's Pods (already reduced to
/// `container` when one is named).
#[allow(clippy::too_many_arguments)]
pub fn resource_replicas(
    current: i32,
    target_utilization: i32,
    resource: &str,
    container: &str,
    tolerances: Tolerances,
    pods: &[&CachedPod],
    mut metrics: PodMetrics,
    r: &Readiness,
) -> Result<Utilization, String> {
    let g = group_pods(pods, &metrics, resource, r)?;
    metrics.retain(|pod, _| !g.ignored.contains(pod) && !g.unready.contains(pod));
    if metrics.is_empty() {
        return Err(NO_READY_METRICS.to_string());
    }
    let requests = pod_requests(pods, container, resource)?;
    let (ratio, utilization, raw_average) =
        utilization_ratio(&metrics, &requests, target_utilization)?;
    let same = Utilization {
        replicas: current,
        utilization,
        raw_average,
    };
    let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && g.missing.is_empty() {
        if tolerances.within(ratio) {
            return Ok(same);
        }
        return Ok(Utilization {
            replicas: ceil_replicas(ratio, g.ready),
            ..same
        });
    }
    let template = zeroed(&metrics);
    if ratio < 1.0 {
        let fallback = i64::from(target_utilization.max(100));
        for pod in &g.missing {
            let request = requests.get(pod).copied().unwrap_or(0);
            metrics.insert(pod.clone(), with_value(&template, request * fallback / 100));
        }
    } else if ratio > 1.0 {
        for pod in &g.missing {
            metrics.insert(pod.clone(), template.clone());
        }
    }
    if scale_up_with_unready {
        for pod in &g.unready {
            metrics.insert(pod.clone(), template.clone());
        }
    }
    let (new_ratio, _, _) = utilization_ratio(&metrics, &requests, target_utilization)?;
    if tolerances.within(new_ratio)
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(same);
    }
    let replicas = ceil_replicas(new_ratio, metrics.len());
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(same);
    }
    Ok(Utilization { replicas, ..same })
}

/// The replica count for an average-value target (upstream's `GetRawResourceReplicas` and its
/// `calcPlainMetricReplicas`): `target` in milli-units.
pub fn raw_resource_replicas(
    current: i32,
    target: i64,
    resource: &str,
    tolerances: Tolerances,
    pods: &[&CachedPod],
    mut metrics: PodMetrics,
    r: &Readiness,
) -> Result<AverageValue, String> {
    let g = group_pods(pods, &metrics, resource, r)?;
    metrics.retain(|pod, _| !g.ignored.contains(pod) && !g.unready.contains(pod));
    if metrics.is_empty() {
        return Err(NO_READY_METRICS.to_string());
    }
    let (ratio, average) = usage_ratio(&metrics, target);
    let same = AverageValue {
        replicas: current,
        average,
    };
    let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && g.missing.is_empty() {
        if tolerances.within(ratio) {
            return Ok(same);
        }
        return Ok(AverageValue {
            replicas: ceil_replicas(ratio, g.ready),
            ..same
        });
    }
    let template = zeroed(&metrics);
    if ratio < 1.0 {
        for pod in &g.missing {
            metrics.insert(pod.clone(), with_value(&template, target));
        }
    } else if ratio > 1.0 {
        for pod in &g.missing {
            metrics.insert(pod.clone(), template.clone());
        }
    }
    if scale_up_with_unready {
        for pod in &g.unready {
            metrics.insert(pod.clone(), template.clone());
        }
    }
    let (new_ratio, _) = usage_ratio(&metrics, target);
    if tolerances.within(new_ratio)
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(same);
    }
    let replicas = ceil_replicas(new_ratio, metrics.len());
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(same);
    }
    Ok(AverageValue { replicas, ..same })
}

#[cfg(test)]
#[path = "replicas_tests.rs"]
mod replicas_tests;
