//! One autoscaler's sync decided over what was read (upstream's `reconcileAutoscaler` and
//! `computeReplicasForMetrics`): the target's scale, the Pods its selector selects and their
//! resource metrics in, the new status (conditions AbleToScale, ScalingActive, ScalingLimited
//! with upstream's reasons and messages), the Events and the rescale to make out.
//!
//! Metric sources: Resource and ContainerResource (utilization and average value) are computed;
//! Pods, Object and External need the custom and external metrics APIs, which this controller
//! does not read: each is an invalid metric whose condition names the field, as upstream reports
//! a metric it cannot get. Pure: the time is an argument.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricTarget, MetricValueStatus,
    ResourceMetricStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::metrics::{reduce, PodMetricsList};
use super::normalize::{self, History};
use super::replicas::{self, Readiness, Tolerances};
use crate::helpers::quantity::{format_milli_binary, format_milli_decimal, parse_milli};
use crate::helpers::selector::Selector;
use crate::runtime::cached_pod::CachedPod;

/// The controller's settings the decisions use.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-downscale-stabilization`.
    pub downscale_stabilization: Duration,
    /// `--horizontal-pod-autoscaler-cpu-initialization-period`.
    pub cpu_initialization_period: Duration,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay`.
    pub initial_readiness_delay: Duration,
}

/// What the target's scale subresource says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleView {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.selector` ("" when the target reports none).
    pub selector: String,
}

/// An Event to record about the autoscaler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Warning (else Normal).
    pub warning: bool,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// The rescale a sync asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescale {
    /// The count now.
    pub current: i32,
    /// The count to write.
    pub desired: i32,
    /// Why ("cpu resource utilization (percentage of request) above target").
    pub reason: String,
}

/// A sync's decisions.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to write (when it differs from the object's).
    pub status: HorizontalPodAutoscalerStatus,
    /// The Events to record.
    pub events: Vec<PlannedEvent>,
    /// The scale to write, if any.
    pub rescale: Option<Rescale>,
    /// The error the sync ends with (logged; the autoscaler is synced again next period).
    pub error: Option<String>,
}

/// Sets a condition in `list` (upstream's `setConditionInList`): its transition time moves only
/// when its status changes.
pub fn set_condition(
    list: &mut Vec<HorizontalPodAutoscalerCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let i = match list.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            list.push(HorizontalPodAutoscalerCondition {
                type_: type_.to_string(),
                ..Default::default()
            });
            list.len() - 1
        }
    };
    let c = &mut list[i];
    if c.status != status {
        c.last_transition_time = Some(Time(now));
    }
    c.status = status.to_string();
    c.reason = Some(reason.to_string());
    c.message = Some(message);
}

/// Whether a sync of `hpa` at `scale` computes metrics (so whether the metrics must be read).
pub fn needs_metrics(hpa: &HorizontalPodAutoscaler, scale: &ScaleView) -> bool {
    let min = min_replicas(hpa);
    let max = hpa.spec.as_ref().map_or(0, |s| s.max_replicas);
    let current = scale.replicas;
    !(current == 0 && min != 0) && current <= max && current >= min
}

fn min_replicas(hpa: &HorizontalPodAutoscaler) -> i32 {
    hpa.spec.as_ref().and_then(|s| s.min_replicas).unwrap_or(1)
}

/// The failure to get the scale (upstream: FailedGetScale Event and AbleToScale False).
pub fn failed_get_scale(hpa: &HorizontalPodAutoscaler, error: &str, now: Timestamp) -> Outcome {
    let mut status = hpa.status.clone().unwrap_or_default();
    set_condition(
        status.conditions.get_or_insert_with(Vec::new),
        "AbleToScale",
        false,
        "FailedGetScale",
        format!("the HPA controller was unable to get the target's current scale: {error}"),
        now,
    );
    Outcome {
        status,
        events: vec![warning("FailedGetScale", error.to_string())],
        rescale: None,
        error: Some(error.to_string()),
    }
}

fn warning(reason: &str, message: String) -> PlannedEvent {
    PlannedEvent {
        warning: true,
        reason: reason.to_string(),
        message,
    }
}

/// What the metric computations read.
pub struct Inputs<'a> {
    /// The namespace's Pods (the selector picks among them).
    pub pods: &'a [&'a CachedPod],
    /// The resource metrics API's answer for the selector (read when [`needs_metrics`]).
    pub metrics: Option<&'a Result<PodMetricsList, String>>,
    /// The other autoscalers whose last selector matches one of `pods` the selector selects,
    /// given those Pods (upstream's ambiguity check); the caller includes this one.
    pub selecting: &'a dyn Fn(&[&CachedPod]) -> Vec<String>,
}

struct Computed {
    replicas: i32,
    metric: String,
    statuses: Vec<MetricStatus>,
}

/// The sync after the scale was read.
pub fn plan(
    hpa: &HorizontalPodAutoscaler,
    scale: &ScaleView,
    inputs: &Inputs<'_>,
    history: &mut History,
    settings: &Settings,
    now: Timestamp,
) -> Outcome {
    let spec = hpa.spec.clone().unwrap_or_default();
    let mut status = hpa.status.clone().unwrap_or_default();
    let mut conditions = status.conditions.take().unwrap_or_default();
    let mut events = Vec::new();
    set_condition(
        &mut conditions,
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale".to_string(),
        now,
    );
    let current = scale.replicas;
    history.record_initial(current, now);
    let min = min_replicas(hpa);
    let max = spec.max_replicas;
    let mut error = None;
    let mut statuses = None;
    let (desired, reason, rescale) = if current == 0 && min != 0 {
        set_condition(
            &mut conditions,
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero".to_string(),
            now,
        );
        (0, String::new(), false)
    } else if current > max {
        (
            max,
            "Current number of replicas above Spec.MaxReplicas".to_string(),
            true,
        )
    } else if current < min {
        (
            min,
            "Current number of replicas below Spec.MinReplicas".to_string(),
            true,
        )
    } else {
        let metrics = spec.metrics.clone().unwrap_or_default();
        let computed = compute_for_metrics(
            hpa,
            scale,
            &metrics,
            inputs,
            &mut conditions,
            &mut events,
            settings,
            now,
        );
        let computed = match computed {
            Ok((c, partial)) => {
                error = partial;
                c
            }
            Err((e, statuses)) => {
                status.current_replicas = Some(current);
                status.current_metrics = statuses;
                status.conditions = Some(conditions);
                events.push(warning("FailedComputeMetricsReplicas", e.clone()));
                return Outcome {
                    status,
                    events,
                    rescale: None,
                    error: Some(e),
                };
            }
        };
        statuses = Some(computed.statuses);
        let mut desired = 0;
        let mut metric = String::new();
        if computed.replicas > desired {
            desired = computed.replicas;
            metric = computed.metric;
        }
        let mut reason = String::new();
        if desired > current {
            reason = format!("{metric} above target");
        }
        if desired < current {
            reason = "All metrics below target".to_string();
        }
        let (desired, verdict) = match spec.behavior.as_ref() {
            None => normalize::normalize(
                history,
                current,
                desired,
                min,
                max,
                settings.downscale_stabilization,
                now,
            ),
            Some(b) => {
                let (up, down) = normalize::effective_rules(
                    b.scale_up.as_ref(),
                    b.scale_down.as_ref(),
                    settings.downscale_stabilization,
                );
                normalize::normalize_with_behavior(
                    history, &up, &down, current, desired, min, max, now,
                )
            }
        };
        let (reason_able, message_able) = verdict.able_to_scale;
        set_condition(
            &mut conditions,
            "AbleToScale",
            true,
            reason_able,
            message_able.to_string(),
            now,
        );
        let (limited, reason_limited, message_limited) = verdict.limited;
        set_condition(
            &mut conditions,
            "ScalingLimited",
            limited,
            reason_limited,
            message_limited.to_string(),
            now,
        );
        (desired, reason, desired != current)
    };
    status.conditions = Some(conditions);
    status.current_replicas = Some(current);
    status.current_metrics = statuses.filter(|s| !s.is_empty());
    if rescale {
        Outcome {
            status,
            events,
            rescale: Some(Rescale {
                current,
                desired,
                reason,
            }),
            error,
        }
    } else {
        status.desired_replicas = current;
        Outcome {
            status,
            events,
            rescale: None,
            error,
        }
    }
}

/// Completes `outcome` once its rescale was written (`Ok`) or failed (`Err`, the error), as
/// upstream does after its scale update: the Event, AbleToScale, desiredReplicas and
/// lastScaleTime, and the scale event `behavior` counts.
pub fn rescaled(
    hpa: &HorizontalPodAutoscaler,
    outcome: &mut Outcome,
    result: Result<(), String>,
    history: &mut History,
    settings: &Settings,
    now: Timestamp,
) {
    let Some(r) = outcome.rescale.clone() else {
        return;
    };
    let conditions = outcome.status.conditions.get_or_insert_with(Vec::new);
    match result {
        Err(e) => {
            outcome.events.push(warning(
                "FailedRescale",
                format!("New size: {}; reason: {}; error: {e}", r.desired, r.reason),
            ));
            set_condition(
                conditions,
                "AbleToScale",
                false,
                "FailedUpdateScale",
                format!("the HPA controller was unable to update the target scale: {e}"),
                now,
            );
            outcome.status.desired_replicas = hpa.status.as_ref().map_or(0, |s| s.desired_replicas);
            outcome.error = Some(e);
        }
        Ok(()) => {
            set_condition(
                conditions,
                "AbleToScale",
                true,
                "SucceededRescale",
                format!(
                    "the HPA controller was able to update the target scale to {}",
                    r.desired
                ),
                now,
            );
            outcome.events.push(PlannedEvent {
                warning: false,
                reason: "SuccessfulRescale".to_string(),
                message: format!("New size: {}; reason: {}", r.desired, r.reason),
            });
            if let Some(b) = hpa.spec.as_ref().and_then(|s| s.behavior.as_ref()) {
                let (up, down) = normalize::effective_rules(
                    b.scale_up.as_ref(),
                    b.scale_down.as_ref(),
                    settings.downscale_stabilization,
                );
                history.store_scale_event((&up, &down), r.current, r.desired, now);
            }
            outcome.status.desired_replicas = r.desired;
            outcome.status.last_scale_time = Some(Time(now));
        }
    }
}

/// Upstream's `computeReplicasForMetrics`: the highest proposal over the metrics; `Err` when
/// every metric is invalid, or some are and the valid ones propose a scale-down (with the
/// statuses to write). `Ok` carries the error of the invalid ones, if any.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn compute_for_metrics(
    hpa: &HorizontalPodAutoscaler,
    scale: &ScaleView,
    metrics: &[MetricSpec],
    inputs: &Inputs<'_>,
    conditions: &mut Vec<HorizontalPodAutoscalerCondition>,
    events: &mut Vec<PlannedEvent>,
    settings: &Settings,
    now: Timestamp,
) -> Result<(Computed, Option<String>), (String, Option<Vec<MetricStatus>>)> {
    let set_scaling_active =
        |conditions: &mut Vec<HorizontalPodAutoscalerCondition>, reason: &str, message: String| {
            set_condition(conditions, "ScalingActive", false, reason, message, now)
        };
    // validateAndParseSelector
    if scale.selector.is_empty() {
        let e = "selector is required".to_string();
        events.push(warning("SelectorRequired", e.clone()));
        set_scaling_active(
            conditions,
            "InvalidSelector",
            "the HPA target's scale is missing a selector".to_string(),
        );
        return Err((e, None));
    }
    let selector = match Selector::parse_string(&scale.selector) {
        Ok(s) => s,
        Err(e) => {
            let e = format!(
                "couldn't convert selector into a corresponding internal selector object: {e}"
            );
            events.push(warning("InvalidSelector", e.clone()));
            set_scaling_active(conditions, "InvalidSelector", e.clone());
            return Err((e, None));
        }
    };
    let pods: Vec<&CachedPod> = inputs
        .pods
        .iter()
        .copied()
        .filter(|p| selector.matches(p.metadata.labels.as_ref()))
        .collect();
    let selecting = (inputs.selecting)(&pods);
    if selecting.len() > 1 {
        let e = format!(
            "pods by selector {} are controlled by multiple HPAs: [{}]",
            scale.selector,
            selecting.join(" ")
        );
        events.push(warning("AmbiguousSelector", e.clone()));
        set_scaling_active(conditions, "AmbiguousSelector", e.clone());
        return Err((e, None));
    }
    let spec_replicas = scale.replicas;
    let mut statuses = vec![MetricStatus::default(); metrics.len()];
    let mut replicas = 0;
    let mut metric_name = String::new();
    let mut invalid = 0;
    let mut first: Option<(String, HorizontalPodAutoscalerCondition)> = None;
    let readiness = Readiness {
        cpu_initialization_period: settings.cpu_initialization_period,
        initial_readiness_delay: settings.initial_readiness_delay,
        now,
    };
    let tolerances = Tolerances::both(settings.tolerance);
    for (i, spec) in metrics.iter().enumerate() {
        match compute_for_metric(
            i,
            spec,
            spec_replicas,
            &pods,
            inputs.metrics,
            tolerances,
            &readiness,
        ) {
            Ok((proposal, name, status)) => {
                statuses[i] = status;
                if replicas == 0 || proposal > replicas {
                    replicas = proposal;
                    metric_name = name;
                }
            }
            Err((reason, event_message, error)) => {
                events.push(warning(reason, event_message.clone()));
                if first.is_none() {
                    first = Some((
                        error,
                        HorizontalPodAutoscalerCondition {
                            type_: "ScalingActive".to_string(),
                            status: "False".to_string(),
                            reason: Some(reason.to_string()),
                            message: Some(format!(
                                "the HPA was unable to compute the replica count: {event_message}"
                            )),
                            last_transition_time: None,
                        },
                    ));
                }
                invalid += 1;
            }
        }
    }
    let error = first.as_ref().map(|(e, _)| {
        format!(
            "invalid metrics ({invalid} invalid out of {}), first error is: {e}",
            metrics.len()
        )
    });
    if invalid >= metrics.len() || (invalid > 0 && replicas < spec_replicas) {
        if let Some((_, c)) = first {
            set_condition(
                conditions,
                &c.type_,
                false,
                c.reason.as_deref().unwrap_or_default(),
                c.message.unwrap_or_default(),
                now,
            );
        }
        let _ = hpa;
        return Err((
            error.unwrap_or_else(|| "no metrics to compute a replica count from".to_string()),
            Some(statuses),
        ));
    }
    set_condition(
        conditions,
        "ScalingActive",
        true,
        "ValidMetricFound",
        format!("the HPA was able to successfully calculate a replica count from {metric_name}"),
        now,
    );
    Ok((
        Computed {
            replicas,
            metric: metric_name,
            statuses,
        },
        error,
    ))
}

/// One metric: `Ok((proposal, metric name, status))` or `Err((reason, Event message, error
/// for the summary))`.
#[allow(clippy::type_complexity)]
fn compute_for_metric(
    index: usize,
    spec: &MetricSpec,
    current: i32,
    pods: &[&CachedPod],
    metrics: Option<&Result<PodMetricsList, String>>,
    tolerances: Tolerances,
    readiness: &Readiness,
) -> Result<(i32, String, MetricStatus), (&'static str, String, String)> {
    let unsupported = |reason: &'static str, field: &str, api: &str| {
        let e = format!(
            "spec.metrics[{index}].{field}: the {field} metric source needs the {api}, which kpr's horizontal pod autoscaler does not read"
        );
        Err((reason, e.clone(), e))
    };
    match spec.type_.as_str() {
        "Object" => unsupported("FailedGetObjectMetric", "object", "custom metrics API"),
        "Pods" => unsupported("FailedGetPodsMetric", "pods", "custom metrics API"),
        "External" => unsupported(
            "FailedGetExternalMetric",
            "external",
            "external metrics API",
        ),
        "Resource" => {
            let Some(r) = spec.resource.as_ref() else {
                return Err(missing_source(index, "resource"));
            };
            let (proposal, name, current_value) = resource_metric(
                &r.name, "", &r.target, current, pods, metrics, tolerances, readiness,
            )
            .map_err(|e| {
                (
                    "FailedGetResourceMetric",
                    e.clone(),
                    format!("failed to get {} resource metric value: {e}", r.name),
                )
            })?;
            Ok((
                proposal,
                name,
                MetricStatus {
                    type_: "Resource".to_string(),
                    resource: Some(ResourceMetricStatus {
                        name: r.name.clone(),
                        current: current_value,
                    }),
                    ..Default::default()
                },
            ))
        }
        "ContainerResource" => {
            let Some(r) = spec.container_resource.as_ref() else {
                return Err(missing_source(index, "containerResource"));
            };
            let (proposal, name, current_value) = resource_metric(
                &r.name,
                &r.container,
                &r.target,
                current,
                pods,
                metrics,
                tolerances,
                readiness,
            )
            .map_err(|e| {
                (
                    "FailedGetContainerResourceMetric",
                    e.clone(),
                    format!("failed to get {} container metric value: {e}", r.container),
                )
            })?;
            Ok((
                proposal,
                name,
                MetricStatus {
                    type_: "ContainerResource".to_string(),
                    container_resource: Some(ContainerResourceMetricStatus {
                        name: r.name.clone(),
                        container: r.container.clone(),
                        current: current_value,
                    }),
                    ..Default::default()
                },
            ))
        }
        other => {
            let e = format!("unknown metric source type {other:?}");
            Err(("InvalidMetricSourceType", e.clone(), e))
        }
    }
}

fn missing_source(index: usize, field: &str) -> (&'static str, String, String) {
    let e = format!("spec.metrics[{index}].{field}: required for this metric type");
    ("InvalidMetricSourceType", e.clone(), e)
}

fn quantity(resource: &str, milli: i64) -> Quantity {
    Quantity(if resource == "memory" {
        format_milli_binary(milli)
    } else {
        format_milli_decimal(milli)
    })
}

/// Upstream's `computeStatusForResourceMetricGeneric`.
#[allow(clippy::too_many_arguments)]
fn resource_metric(
    resource: &str,
    container: &str,
    target: &MetricTarget,
    current: i32,
    pods: &[&CachedPod],
    metrics: Option<&Result<PodMetricsList, String>>,
    tolerances: Tolerances,
    readiness: &Readiness,
) -> Result<(i32, String, MetricValueStatus), String> {
    let fetched = || -> Result<replicas::PodMetrics, String> {
        let read = match metrics {
            Some(Ok(list)) => Ok(reduce(list, resource, container)),
            Some(Err(e)) => Err(e.clone()),
            None => Err("the resource metrics API was not read".to_string()),
        };
        read.map_err(|e| format!("unable to get metrics for resource {resource}: {e}"))
    };
    if let Some(average) = target.average_value.as_ref() {
        let target_milli = parse_milli(&average.0).unwrap_or(0);
        let out = fetched()
            .and_then(|m| {
                replicas::raw_resource_replicas(
                    current,
                    target_milli,
                    resource,
                    tolerances,
                    pods,
                    m,
                    readiness,
                )
            })
            .map_err(|e| format!("failed to get {resource} usage: {e}"))?;
        return Ok((
            out.replicas,
            format!("{resource} resource"),
            MetricValueStatus {
                average_value: Some(quantity(resource, out.average)),
                ..Default::default()
            },
        ));
    }
    let Some(utilization) = target.average_utilization else {
        return Err("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".to_string());
    };
    let out = fetched()
        .and_then(|m| {
            replicas::resource_replicas(
                current,
                utilization,
                resource,
                container,
                tolerances,
                pods,
                m,
                readiness,
            )
        })
        .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
    let name = if container.is_empty() {
        format!("{resource} resource utilization (percentage of request)")
    } else {
        format!("{resource} container resource utilization (percentage of request)")
    };
    Ok((
        out.replicas,
        name,
        MetricValueStatus {
            average_utilization: Some(out.utilization),
            average_value: Some(quantity(resource, out.raw_average)),
            value: None,
        },
    ))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod plan_tests;
