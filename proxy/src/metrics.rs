//! Prometheus metrics, named as kube-proxy names them where one exists (`kubeproxy_*`), so existing
//! dashboards and alerts keep working; kpr's own additions are `kpr_*`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficPolicyLabel {
    pub traffic_policy: String,
}

/// A dataplane map (eBPF map name) that was found full.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabel {
    pub map: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub family: String,
}

/// A transport protocol (`tcp`, `udp`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabel {
    pub protocol: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub sync_full_duration: Histogram,
    pub sync_partial_duration: Histogram,
    pub network_programming_duration: Histogram,
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    pub last_queued_timestamp: Gauge<f64, AtomicU64>,
    pub no_local_endpoints: Family<TrafficPolicyLabel, Gauge>,
    pub unserved: Family<FamilyLabel, Gauge>,
    pub endpoint_changes_total: Counter,
    pub service_changes_total: Counter,
    pub sync_errors_total: Counter,
    pub map_full_total: Family<MapLabel, Counter>,
    pub sockets_destroyed_total: Family<ProtocolLabel, Counter>,
    pub invalid_objects: Gauge,
    pub service_ports: Gauge,
    pub endpoints: Gauge,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::with_collectors(Vec::new())
    }
}

impl Metrics {
    /// The agent's metrics, plus `collectors` (a backend's, read at each scrape) under `kpr_`.
    pub fn with_collectors(
        collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
    ) -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            sync_duration: seconds_histogram(),
            sync_full_duration: seconds_histogram(),
            sync_partial_duration: seconds_histogram(),
            network_programming_duration: seconds_histogram(),
            last_sync_timestamp: Gauge::default(),
            last_queued_timestamp: Gauge::default(),
            no_local_endpoints: Family::default(),
            unserved: Family::default(),
            endpoint_changes_total: Counter::default(),
            service_changes_total: Counter::default(),
            sync_errors_total: Counter::default(),
            map_full_total: Family::default(),
            sockets_destroyed_total: Family::default(),
            invalid_objects: Gauge::default(),
            service_ports: Gauge::default(),
            endpoints: Gauge::default(),
        };
        m.register();
        let kpr = m.registry.sub_registry_with_prefix("kpr");
        for c in collectors {
            kpr.register_collector(c);
        }
        m
    }

    /// Counts the sockets one sync destroyed.
    pub fn count_destroyed(&self, d: &crate::state::SocketsDestroyed) {
        for (protocol, n) in [("tcp", d.tcp), ("udp", d.udp)] {
            if n > 0 {
                let label = ProtocolLabel {
                    protocol: protocol.into(),
                };
                self.sockets_destroyed_total.get_or_create(&label).inc_by(n);
            }
        }
    }

    fn register(&mut self) {
        let kp = self.registry.sub_registry_with_prefix("kubeproxy");
        kp.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        kp.register(
            "sync_full_proxy_rules_duration_seconds",
            "Latency of full syncs in seconds",
            self.sync_full_duration.clone(),
        );
        kp.register(
            "sync_partial_proxy_rules_duration_seconds",
            "Latency of partial syncs in seconds",
            self.sync_partial_duration.clone(),
        );
        kp.register(
            "network_programming_duration_seconds",
            "Time from a change being received to the dataplane being programmed",
            self.network_programming_duration.clone(),
        );
        kp.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time a sync succeeded",
            self.last_sync_timestamp.clone(),
        );
        kp.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync was queued",
            self.last_queued_timestamp.clone(),
        );
        kp.register(
            "sync_proxy_rules_no_local_endpoints",
            "Service ports with a Local traffic policy and no local endpoint",
            self.no_local_endpoints.clone(),
        );
        kp.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative endpoint changes",
            self.endpoint_changes_total.clone(),
        );
        kp.register(
            "sync_proxy_rules_service_changes",
            "Cumulative service changes",
            self.service_changes_total.clone(),
        );
        let kpr = self.registry.sub_registry_with_prefix("kpr");
        kpr.register(
            "sync_errors",
            "Syncs that failed (the next one is a full resync)",
            self.sync_errors_total.clone(),
        );
        kpr.register(
            "map_full",
            "Syncs that found a dataplane map full (a Service port was not programmed), by map",
            self.map_full_total.clone(),
        );
        kpr.register(
            "sockets_destroyed",
            "Sockets connected to endpoints that left, destroyed by the ebpf backend, by protocol",
            self.sockets_destroyed_total.clone(),
        );
        kpr.register(
            "invalid_objects",
            "Input problems currently reported (bad manifests, fields)",
            self.invalid_objects.clone(),
        );
        kpr.register(
            "service_ports",
            "Service ports programmed",
            self.service_ports.clone(),
        );
        kpr.register("endpoints", "Endpoints known", self.endpoints.clone());
        kpr.register(
            "service_ports_unserved",
            "Service ports with addresses of a family this backend or node does not program, by family",
            self.unserved.clone(),
        );
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destroyed_sockets_are_counted_by_protocol() {
        let m = Metrics::default();
        m.count_destroyed(&crate::state::SocketsDestroyed { tcp: 2, udp: 0 });
        m.count_destroyed(&crate::state::SocketsDestroyed { tcp: 1, udp: 3 });
        let text = m.encode();
        assert!(
            text.contains("kpr_sockets_destroyed_total{protocol=\"tcp\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("kpr_sockets_destroyed_total{protocol=\"udp\"} 3"),
            "{text}"
        );
    }
}
