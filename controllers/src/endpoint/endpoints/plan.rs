//! The legacy Endpoints object of a Service (rules EP-1..EP-6): pure computation.
//!
//! For every selected Pod that belongs in endpoints, one address (ip, nodeName, targetRef); for every
//! Service port the target port resolved on that Pod (named ports per Pod, on containers then
//! sidecars: `endpointutil::resolve_target_port`, upstream's `FindPort`); the address
//! goes to `addresses` when the Pod is ready or the Service tolerates unready endpoints
//! (publishNotReadyAddresses), to `notReadyAddresses` otherwise. Terminating Pods are left out unless
//! unready endpoints are tolerated. Subsets are repacked: addresses sharing one port set share one
//! subset. The object carries the Service's labels. Over 1000 addresses are truncated with the
//! `endpoints.kubernetes.io/over-capacity` annotation, as upstream.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::endpoint::endpointutil;
use crate::runtime::cached_pod::CachedPod;

/// Upstream's cap on addresses in one Endpoints object.
pub const MAX_ADDRESSES: usize = 1000;
/// Set when addresses were truncated.
pub const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";

type PortKey = Vec<(Option<String>, i32, Option<String>)>;

/// One subset being built: ports, ready addresses, not-ready addresses.
type Group = (
    Vec<EndpointPort>,
    Vec<EndpointAddress>,
    Vec<EndpointAddress>,
);

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut k: PortKey = ports
        .iter()
        .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
        .collect();
    k.sort();
    k
}

fn address(pod: &CachedPod, ip: String) -> EndpointAddress {
    let spec = pod.spec.as_ref();
    EndpointAddress {
        ip,
        hostname: spec.and_then(|s| s.hostname.clone()),
        node_name: spec.and_then(|s| s.node_name.clone()),
        target_ref: Some(endpointutil::pod_reference(pod)),
    }
}

fn ports_for(svc: &Service, pod: &CachedPod) -> Vec<EndpointPort> {
    endpointutil::resolved_ports(svc, pod)
        .map(|(sp, port, protocol)| EndpointPort {
            name: sp.name.clone(),
            port,
            protocol: Some(protocol),
            app_protocol: sp.app_protocol.clone(),
        })
        .collect()
}

/// The subsets for a Service and its selected Pods, repacked and sorted.
pub fn subsets(svc: &Service, pods: &[Arc<CachedPod>]) -> Vec<EndpointSubset> {
    let tolerate = endpointutil::publish_not_ready(svc);
    let mut groups: BTreeMap<PortKey, Group> = BTreeMap::new();
    for pod in pods
        .iter()
        .filter(|p| endpointutil::should_be_in_endpoints(p, tolerate))
    {
        let Some(ip) = endpointutil::pod_ips(pod).first().map(ToString::to_string) else {
            continue;
        };
        let ports = ports_for(svc, pod);
        let entry = groups
            .entry(port_key(&ports))
            .or_insert_with(|| (ports, Vec::new(), Vec::new()));
        if tolerate || crate::runtime::pods::is_pod_ready(pod) {
            entry.1.push(address(pod, ip));
        } else {
            entry.2.push(address(pod, ip));
        }
    }
    groups
        .into_values()
        .map(|(ports, mut ready, mut not_ready)| {
            ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            not_ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

/// Keeps at most `MAX_ADDRESSES` addresses (ready ones first); true when something was cut.
fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let total: usize = subsets
        .iter()
        .map(|s| {
            s.addresses.as_ref().map_or(0, Vec::len)
                + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
        })
        .sum();
    if total <= MAX_ADDRESSES {
        return false;
    }
    let mut budget = MAX_ADDRESSES;
    for s in subsets.iter_mut() {
        if let Some(l) = &mut s.addresses {
            l.truncate(budget);
            budget -= l.len();
        }
    }
    for s in subsets.iter_mut() {
        if let Some(l) = &mut s.not_ready_addresses {
            l.truncate(budget);
            budget -= l.len();
        }
    }
    true
}

/// The desired Endpoints object, or None when the Service is not managed (no selector,
/// ExternalName).
pub fn desired(svc: &Service, pods: &[Arc<CachedPod>]) -> Option<Endpoints> {
    endpointutil::service_selector(svc)?;
    if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        return None;
    }
    let mut subsets = subsets(svc, pods);
    let mut labels = svc.labels().clone();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    let annotations = truncate(&mut subsets)
        .then(|| BTreeMap::from([(OVER_CAPACITY.to_string(), "truncated".to_string())]));
    Some(Endpoints {
        metadata: ObjectMeta {
            name: Some(svc.name_any()),
            namespace: svc.namespace(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations,
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    })
}

/// What to write, given the cached object: None when it already matches.
pub fn plan(desired: Endpoints, existing: Option<&Endpoints>) -> Option<Endpoints> {
    let Some(cur) = existing else {
        return Some(desired);
    };
    let same = cur.subsets.as_deref().unwrap_or(&[]) == desired.subsets.as_deref().unwrap_or(&[])
        && cur.labels() == desired.labels()
        && cur.annotations().get(OVER_CAPACITY) == desired.annotations().get(OVER_CAPACITY);
    if same {
        return None;
    }
    let mut out = cur.clone();
    out.subsets = desired.subsets;
    out.metadata.labels = desired.metadata.labels;
    let mut annotations = cur.annotations().clone();
    annotations.remove(OVER_CAPACITY);
    annotations.extend(desired.metadata.annotations.unwrap_or_default());
    out.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(publish: bool) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "labels": {"team": "a"}},
            "spec": {"selector": {"app": "web"}, "publishNotReadyAddresses": publish,
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}, {"name": "raw", "port": 81}]}
        }))
        .unwrap()
    }

    fn pod(i: u8, ready: bool, port: i32, terminating: bool) -> Arc<CachedPod> {
        let mut meta =
            json!({"name": format!("p{i}"), "namespace": "ns", "labels": {"app": "web"}});
        if terminating {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": meta,
                "spec": {"containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": port}]}]},
                "status": {"podIP": format!("10.0.0.{i}"), "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
            }))
            .unwrap(),
        )
    }

    fn ips(l: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
        l.iter().flatten().map(|a| a.ip.as_str()).collect()
    }

    #[test]
    fn ready_and_not_ready_addresses_are_split() {
        let s = subsets(
            &svc(false),
            &[
                pod(2, true, 8080, false),
                pod(1, false, 8080, false),
                pod(3, true, 8080, true),
            ],
        );
        assert_eq!(s.len(), 1);
        assert_eq!(ips(&s[0].addresses), ["10.0.0.2"]);
        assert_eq!(
            ips(&s[0].not_ready_addresses),
            ["10.0.0.1"],
            "terminating pods are left out"
        );
        let ports: Vec<(Option<&str>, i32)> = s[0]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.port))
            .collect();
        assert_eq!(ports, [(Some("http"), 8080), (Some("raw"), 81)]);
    }

    #[test]
    fn publish_not_ready_tolerates_unready_and_terminating() {
        let s = subsets(
            &svc(true),
            &[pod(1, false, 8080, false), pod(3, true, 8080, true)],
        );
        assert_eq!(ips(&s[0].addresses), ["10.0.0.1", "10.0.0.3"]);
        assert!(s[0].not_ready_addresses.is_none());
    }

    #[test]
    fn repack_groups_addresses_by_port_set() {
        let s = subsets(
            &svc(false),
            &[
                pod(1, true, 8080, false),
                pod(2, true, 9090, false),
                pod(3, true, 8080, false),
            ],
        );
        let got: Vec<(i32, Vec<&str>)> = s
            .iter()
            .map(|x| (x.ports.as_ref().unwrap()[0].port, ips(&x.addresses)))
            .collect();
        assert_eq!(
            got,
            [
                (8080, vec!["10.0.0.1", "10.0.0.3"]),
                (9090, vec!["10.0.0.2"])
            ]
        );
    }

    #[test]
    fn named_ports_resolve_on_sidecars() {
        // The named port only on a sidecar (restartable init container): resolved there, as
        // upstream's FindPort does for the Endpoints controller too.
        let mut p = (*pod(1, true, 8080, false)).clone();
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].ports = None;
        spec.init_containers = Some(vec![serde_json::from_value(
            json!({"name": "proxy", "image": "x", "restartPolicy": "Always",
                   "ports": [{"name": "http", "containerPort": 8443}]}),
        )
        .unwrap()]);
        let s = subsets(&svc(false), &[Arc::new(p.clone())]);
        let ports: Vec<(Option<&str>, i32)> = s[0]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.port))
            .collect();
        assert_eq!(ports, [(Some("http"), 8443), (Some("raw"), 81)]);
        // A plain init container's port is not used: only the numeric port remains.
        let init = &mut p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0];
        init.restart_policy = None;
        let s = subsets(&svc(false), &[Arc::new(p)]);
        let ports: Vec<i32> = s[0].ports.iter().flatten().map(|p| p.port).collect();
        assert_eq!(ports, [81]);
    }

    #[test]
    fn object_is_named_after_the_service_with_its_labels_and_writes_only_on_change() {
        let e = desired(&svc(false), &[pod(1, true, 8080, false)]).unwrap();
        assert_eq!(
            (e.name_any(), e.labels()["team"].as_str()),
            ("web".to_string(), "a")
        );
        assert!(plan(e.clone(), Some(&e)).is_none(), "unchanged: no write");
        let changed = desired(&svc(false), &[pod(1, false, 8080, false)]).unwrap();
        assert!(plan(changed, Some(&e)).is_some());
        let no_selector: Service =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {}})).unwrap();
        assert!(
            desired(&no_selector, &[]).is_none(),
            "services without a selector are not managed"
        );
    }

    #[test]
    fn more_than_1000_addresses_are_truncated() {
        let pods: Vec<Arc<CachedPod>> = (0..1100u32)
            .map(|i| {
                let mut p = (*pod(1, true, 8080, false)).clone();
                p.metadata.name = Some(format!("p{i}"));
                p.status.as_mut().unwrap().pod_ip = Some(format!("10.1.{}.{}", i / 256, i % 256));
                Arc::new(p)
            })
            .collect();
        let e = desired(&svc(false), &pods).unwrap();
        assert_eq!(
            e.subsets.as_ref().unwrap()[0]
                .addresses
                .as_ref()
                .unwrap()
                .len(),
            MAX_ADDRESSES
        );
        assert_eq!(e.annotations()[OVER_CAPACITY], "truncated");
    }
}
