//! The resource metrics API client (upstream's `metrics/client.go`, `resourceMetricsClient`):
//! lists `metrics.k8s.io/v1beta1` PodMetrics of a namespace by label selector, through the API
//! server (which proxies the group to the APIService serving it: metrics-server on real nodes),
//! and reduces them to one value per Pod for a resource, summed over its containers or of one
//! container.
//!
//! When the API server does not serve the group (a cluster without metrics-server, a kwok-only
//! one), the list fails and the error names the group: the autoscaler reports it in its
//! ScalingActive condition and never scales on nothing. Owns: this read and its parsing.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::Client;
use serde::Deserialize;

use super::replicas::{PodMetric, PodMetrics};
use crate::helpers::quantity::parse_milli;

/// The group and version read.
pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// A `PodMetricsList`, as much of it as is read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetricsList {
    /// The Pods' samples.
    #[serde(default)]
    pub items: Vec<PodMetricsItem>,
}

/// One Pod's sample.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetricsItem {
    /// The Pod's name and namespace.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The end of the sample's window.
    #[serde(default)]
    pub timestamp: Option<Time>,
    /// The window, a Go duration ("30s", "1m0s").
    #[serde(default)]
    pub window: Option<String>,
    /// Usage per container.
    #[serde(default)]
    pub containers: Vec<ContainerMetrics>,
}

/// One container's usage.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerMetrics {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Usage by resource name.
    #[serde(default)]
    pub usage: BTreeMap<String, Quantity>,
}

/// A metrics window (a Go duration string, "30s"); unparsable is zero.
fn window_of(s: &str) -> Duration {
    crate::helpers::duration::parse_go_duration(s).unwrap_or(Duration::ZERO)
}

/// One value per Pod for `resource` (upstream's `getPodMetrics` / `getContainerMetrics`): the
/// sum over the Pod's containers (a Pod with no containers, or one lacking the resource, has
/// none), or the named container's.
pub fn reduce(list: &PodMetricsList, resource: &str, container: &str) -> PodMetrics {
    let mut out = PodMetrics::new();
    for m in &list.items {
        let name = m.metadata.name.clone().unwrap_or_default();
        let timestamp = m.timestamp.as_ref().map_or(Timestamp::UNIX_EPOCH, |t| t.0);
        let window = window_of(m.window.as_deref().unwrap_or_default());
        let value = if container.is_empty() {
            if m.containers.is_empty() {
                None
            } else {
                m.containers
                    .iter()
                    .map(|c| c.usage.get(resource).and_then(|q| parse_milli(&q.0)))
                    .sum::<Option<i64>>()
            }
        } else {
            m.containers
                .iter()
                .find(|c| c.name == container)
                .and_then(|c| c.usage.get(resource))
                .and_then(|q| parse_milli(&q.0))
        };
        if let Some(value) = value {
            out.insert(
                name,
                PodMetric {
                    value,
                    timestamp,
                    window,
                },
            );
        }
    }
    out
}

/// Lists the PodMetrics of `namespace` that `selector` (a selector string) selects. The error
/// is the message upstream's client reports, "unable to fetch metrics from resource metrics
/// API: ...", or "no metrics returned from resource metrics API" for an empty list.
pub async fn list(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<PodMetricsList, String> {
    let path = format!("/apis/{GROUP_VERSION}/namespaces/{namespace}/pods");
    let request = kube::core::Request::new(path)
        .list(&ListParams::default().labels(selector))
        .map_err(|e| format!("unable to fetch metrics from resource metrics API: {e}"))?;
    let list: PodMetricsList = client.request(request).await.map_err(|e| {
        format!(
            "unable to fetch metrics from resource metrics API: {}",
            describe(&e)
        )
    })?;
    if list.items.is_empty() {
        return Err("no metrics returned from resource metrics API".to_string());
    }
    Ok(list)
}

/// An API error as client-go prints it: the server's message, and for a bare 404 (the group is
/// not served) the request it answered, naming the group.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.code == 404 => {
            let message = if status.message.is_empty() {
                "the server could not find the requested resource"
            } else {
                status.message.as_str()
            };
            format!("{message} (get pods.metrics.k8s.io)")
        }
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_durations_parse() {
        assert_eq!(window_of("30s"), Duration::from_secs(30));
        assert_eq!(window_of("1m30.5s"), Duration::from_millis(90_500));
        assert_eq!(window_of("bogus"), Duration::ZERO);
    }

    #[test]
    fn pod_values_sum_containers_or_take_the_named_one() {
        let list: PodMetricsList = serde_json::from_value(json!({"items": [
            {"metadata": {"name": "a"}, "timestamp": "2025-01-01T00:00:00Z", "window": "30s",
             "containers": [{"name": "app", "usage": {"cpu": "100m", "memory": "1Mi"}},
                            {"name": "side", "usage": {"cpu": "50m", "memory": "1Mi"}}]},
            {"metadata": {"name": "b"}, "timestamp": "2025-01-01T00:00:00Z", "window": "30s",
             "containers": [{"name": "app", "usage": {"memory": "2Mi"}}]},
            {"metadata": {"name": "c"}, "timestamp": "2025-01-01T00:00:00Z", "window": "30s",
             "containers": []}
        ]}))
        .unwrap();
        let cpu = reduce(&list, "cpu", "");
        assert_eq!(cpu.len(), 1, "b lacks cpu, c has no containers");
        assert_eq!(cpu["a"].value, 150);
        assert_eq!(cpu["a"].window, Duration::from_secs(30));
        let app = reduce(&list, "cpu", "side");
        assert_eq!(app["a"].value, 50);
        assert!(!app.contains_key("b"));
        assert_eq!(
            reduce(&list, "memory", "")["b"].value,
            2 * 1024 * 1024 * 1000
        );
    }
}
