//! What the endpoint controllers share, as upstream's `pkg/controller/util/endpoint`: selector
//! matching, which Pods belong in endpoints, endpoint conditions, named target port resolution,
//! the work queue's retry policy, and the tracker of slices written but not yet seen by the cache.
//!
//! No I/O: every function takes the objects (or the cache) it needs.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::containers::long_running;
use crate::runtime::cache::{Indexed, Key};
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::queue::{Bucket, ItemBackoff, RateLimiter, WorkQueue};
use k8s_openapi::api::core::v1::{ObjectReference, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;

/// The three EndpointSlice conditions of one Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Should receive new traffic.
    pub ready: bool,
    /// Passes its readiness check (also while terminating).
    pub serving: bool,
    /// Has a deletionTimestamp.
    pub terminating: bool,
}

/// Whether every `selector` pair is among `labels` (an empty selector matches nothing here: Services
/// without a selector are not managed).
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    !selector.is_empty()
        && labels.is_some_and(|l| selector.iter().all(|(k, v)| l.get(k) == Some(v)))
}

/// The Service's selector when it has a non-empty one.
pub fn service_selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

/// The Pod's IPs (status.podIPs, else status.podIP), parsed; unparsable ones are skipped.
pub fn pod_ips(pod: &CachedPod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if out.is_empty() {
        out.extend(
            status
                .pod_ip
                .as_deref()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    out
}

/// Whether the Pod goes into endpoints at all: not terminal, has an IP, and, when
/// `include_terminating` is false, not being deleted.
pub fn should_be_in_endpoints(pod: &CachedPod, include_terminating: bool) -> bool {
    !pod.is_terminal()
        && !pod_ips(pod).is_empty()
        && (include_terminating || pod.metadata.deletion_timestamp.is_none())
}

/// EndpointSlice conditions as kube-controller-manager computes them: serving is the Ready
/// condition, terminating is a deletionTimestamp, ready is serving and not terminating, or always
/// true with publishNotReadyAddresses.
pub fn conditions(pod: &CachedPod, publish_not_ready: bool) -> Conditions {
    let serving = crate::runtime::pods::is_pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Conditions {
        ready: publish_not_ready || (serving && !terminating),
        serving,
        terminating,
    }
}

/// `spec.publishNotReadyAddresses`.
pub fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// The reference to a Pod an endpoint's `targetRef` holds (kind, namespace, name, uid).
pub fn pod_reference(pod: &CachedPod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.namespace(),
        name: Some(pod.name_any()),
        uid: pod.uid(),
        ..Default::default()
    }
}

/// Resolves a Service port's targetPort on one Pod as upstream's `FindPort` (used by both the
/// Endpoints and the EndpointSlice controller): a number is used as is (default: the Service port),
/// a name is looked up among the ports with the same protocol of the Pod's containers, then of its
/// sidecars (init containers with `restartPolicy: Always`; plain init containers are not used).
/// `None` when a name is not found (that port is then left out for this Pod, as upstream does).
pub fn resolve_target_port(pod: &CachedPod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            let spec = pod.spec.as_ref()?;
            long_running(&spec.containers, spec.init_containers.as_ref())
                .flat_map(|c| c.ports.iter().flatten())
                .find_map(|cp| {
                    let same_protocol = cp.protocol.as_deref().unwrap_or("TCP") == protocol;
                    (cp.name.as_deref() == Some(name.as_str()) && same_protocol)
                        .then_some(cp.container_port)
                })
        }
    }
}

/// The Service's ports whose target resolves on `pod` ([`resolve_target_port`]), in the Service's
/// order, each with the resolved port and its protocol (`TCP` when unset): what both controllers
/// turn into their endpoint ports.
pub fn resolved_ports<'a>(
    svc: &'a Service,
    pod: &'a CachedPod,
) -> impl Iterator<Item = (&'a ServicePort, i32, String)> + 'a {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(move |sp| {
            let port = resolve_target_port(pod, sp)?;
            Some((
                sp,
                port,
                sp.protocol.clone().unwrap_or_else(|| "TCP".into()),
            ))
        })
}

/// The work queue of an endpoint controller: a failed sync is retried after 1 s doubling up to
/// 1,000 s, overall at most 10 a second with a burst of 100, as upstream's EndpointSlice and
/// Endpoints controllers (`defaultSyncBackOff`, `maxSyncBackOff`) rather than the 5 ms of
/// `DefaultControllerRateLimiter`: a sync that failed on a conflict needs the cache to catch up.
pub fn work_queue(name: &str) -> Arc<WorkQueue<String>> {
    WorkQueue::with_limiter(
        name,
        RateLimiter::new(
            ItemBackoff::new(Duration::from_secs(1), Duration::from_secs(1000)),
            Bucket::new(10.0, 100),
        ),
    )
}

/// How long a written slice may stay unseen by the cache before the tracker gives up on it.
const EXPECTATION_TTL: Duration = Duration::from_secs(10);

/// What the cache must show of a written slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The cache shows the slice at this generation or later.
    Generation(i64),
    /// The cache no longer shows the slice.
    Gone,
}

/// Slices written per Service (or Endpoints) that the cache must reflect before the next plan,
/// as upstream's `EndpointSliceTracker`: a sync planning from a cache that has not yet seen its own
/// writes would undo or repeat them.
#[derive(Default)]
pub struct Tracker(Mutex<Tracked>);

#[derive(Default)]
struct Tracked {
    services: HashMap<Key, Pending>,
    /// When expired expectations were last dropped from every Service's entry.
    last_sweep: Option<Instant>,
}

/// Slice name -> what the cache must show, and since when.
type Pending = HashMap<String, (Expect, Instant)>;

impl Tracker {
    /// Remembers that the cache must show `e` for `slice` of `svc`.
    pub fn expect(&self, svc: &Key, slice: String, e: Expect) {
        self.expect_at(svc, slice, e, Instant::now());
    }

    /// [`Tracker::expect`] at `now`. An entry is otherwise dropped only by [`Tracker::stale`],
    /// which runs for Services still in the cache: the slices of a deleted Service are expected
    /// gone and nothing asks again. So, at most once per [`EXPECTATION_TTL`], expired
    /// expectations are dropped from every entry, and the map holds what was written in the
    /// last two TTLs at most, whatever the churn of Service names.
    fn expect_at(&self, svc: &Key, slice: String, e: Expect, now: Instant) {
        let mut t = self.0.lock().expect("tracker lock");
        t.services
            .entry(svc.clone())
            .or_default()
            .insert(slice, (e, now));
        if t.last_sweep
            .is_none_or(|last| now.saturating_duration_since(last) >= EXPECTATION_TTL)
        {
            t.services.retain(|_, pending| {
                pending.retain(|_, (_, at)| now.saturating_duration_since(*at) < EXPECTATION_TTL);
                !pending.is_empty()
            });
            t.last_sweep = Some(now);
        }
    }

    /// How many Services have writes the cache may not show yet.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.0.lock().expect("tracker lock").services.len()
    }

    /// True while some write of this Service is not yet visible in `slices`.
    pub fn stale(&self, svc: &Key, slices: &Indexed<EndpointSlice>) -> bool {
        let mut t = self.0.lock().expect("tracker lock");
        let Some(pending) = t.services.get_mut(svc) else {
            return false;
        };
        pending.retain(|name, (e, at)| {
            let cached = slices.get(&svc.0, name);
            let seen = match e {
                Expect::Gone => cached.is_none(),
                Expect::Generation(g) => {
                    cached.is_some_and(|c| c.metadata.generation.unwrap_or(0) >= *g)
                }
            };
            !seen && at.elapsed() < EXPECTATION_TTL
        });
        let stale = !pending.is_empty();
        if !stale {
            t.services.remove(svc);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_tracker_drops_expired_expectations_of_services_nobody_syncs_again() {
        let tracker = Tracker::default();
        let now = Instant::now();
        let Some(then) = now.checked_sub(EXPECTATION_TTL + Duration::from_secs(1)) else {
            panic!("the monotonic clock started less than {EXPECTATION_TTL:?} ago");
        };
        // A deleted Service's slices, expected gone long ago: nothing calls `stale` for it.
        for i in 0..100 {
            let gone: Key = ("ns".into(), format!("deleted-{i}"));
            tracker.expect_at(&gone, format!("deleted-{i}-x"), Expect::Gone, then);
        }
        assert_eq!(tracker.tracked(), 100, "kept within the TTL");
        let fresh: Key = ("ns".into(), "web".into());
        tracker.expect_at(&fresh, "web-x".into(), Expect::Generation(2), now);
        assert_eq!(
            tracker.tracked(),
            1,
            "the expired entries dropped, the fresh one kept"
        );
    }

    fn pod(v: serde_json::Value) -> CachedPod {
        serde_json::from_value(v).unwrap()
    }

    fn named_port_pod() -> CachedPod {
        pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "x", "ports": [{"name": "http", "containerPort": 8080},
                                                 {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]},
            {"name": "b", "image": "x", "ports": [{"name": "metrics", "containerPort": 9090}]}]}}))
    }

    fn sp(v: serde_json::Value) -> ServicePort {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn named_port_resolution_cases() {
        let p = named_port_pod();
        let cases = [
            (
                "numeric target",
                json!({"port": 80, "targetPort": 8081}),
                Some(8081),
            ),
            ("no target uses port", json!({"port": 80}), Some(80)),
            (
                "named in first container",
                json!({"port": 80, "targetPort": "http"}),
                Some(8080),
            ),
            (
                "named in second container",
                json!({"port": 80, "targetPort": "metrics"}),
                Some(9090),
            ),
            (
                "named with UDP protocol",
                json!({"port": 53, "protocol": "UDP", "targetPort": "dns"}),
                Some(5353),
            ),
            (
                "named but protocol differs",
                json!({"port": 53, "targetPort": "dns"}),
                None,
            ),
            (
                "unknown name",
                json!({"port": 80, "targetPort": "nope"}),
                None,
            ),
            (
                "numeric string",
                json!({"port": 80, "targetPort": "8082"}),
                Some(8082),
            ),
        ];
        for (name, port, want) in cases {
            assert_eq!(resolve_target_port(&p, &sp(port)), want, "{name}");
        }
    }

    #[test]
    fn named_ports_resolve_on_sidecars_after_containers() {
        let with_sidecar = |main: serde_json::Value| {
            pod(json!({"metadata": {"name": "p"}, "spec": {
                "containers": [{"name": "main", "image": "x", "ports": main}],
                "initContainers": [
                    {"name": "plain-init", "image": "x",
                     "ports": [{"name": "init-only", "containerPort": 7000}]},
                    {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                     "ports": [{"name": "http", "containerPort": 8443},
                               {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]}}))
        };
        let cases = [
            (
                "only on the sidecar",
                json!([]),
                json!({"port": 80, "targetPort": "http"}),
                Some(8443),
            ),
            (
                "containers come first",
                json!([{"name": "http", "containerPort": 9000}]),
                json!({"port": 80, "targetPort": "http"}),
                Some(9000),
            ),
            (
                "sidecar, same protocol only",
                json!([]),
                json!({"port": 53, "protocol": "UDP", "targetPort": "dns"}),
                Some(5353),
            ),
            (
                "sidecar, other protocol",
                json!([]),
                json!({"port": 53, "targetPort": "dns"}),
                None,
            ),
            (
                "plain init containers are not used",
                json!([]),
                json!({"port": 80, "targetPort": "init-only"}),
                None,
            ),
        ];
        for (name, main, port, want) in cases {
            assert_eq!(
                resolve_target_port(&with_sidecar(main), &sp(port)),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn condition_cases() {
        let ready =
            json!({"conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.1"});
        let unready =
            json!({"conditions": [{"type": "Ready", "status": "False"}], "podIP": "10.0.0.1"});
        let deleting = json!({"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"});
        let c = |cs: [bool; 3]| Conditions {
            ready: cs[0],
            serving: cs[1],
            terminating: cs[2],
        };
        let cases = [
            (
                "ready pod",
                json!({"metadata": {"name": "p"}, "status": ready}),
                false,
                c([true, true, false]),
            ),
            (
                "unready pod",
                json!({"metadata": {"name": "p"}, "status": unready}),
                false,
                c([false, false, false]),
            ),
            (
                "unready pod, publishNotReady",
                json!({"metadata": {"name": "p"}, "status": unready}),
                true,
                c([true, false, false]),
            ),
            (
                "terminating ready pod",
                json!({"metadata": deleting, "status": ready}),
                false,
                c([false, true, true]),
            ),
            (
                "terminating unready pod",
                json!({"metadata": deleting, "status": unready}),
                false,
                c([false, false, true]),
            ),
            (
                "terminating pod, publishNotReady",
                json!({"metadata": deleting, "status": unready}),
                true,
                c([true, false, true]),
            ),
        ];
        for (name, p, pnr, want) in cases {
            assert_eq!(conditions(&pod(p), pnr), want, "{name}");
        }
    }

    #[test]
    fn membership_cases() {
        let cases = [
            (
                "running with IP",
                json!({"phase": "Running", "podIP": "10.0.0.1"}),
                None,
                true,
            ),
            ("no IP yet", json!({"phase": "Pending"}), None, false),
            (
                "succeeded",
                json!({"phase": "Succeeded", "podIP": "10.0.0.1"}),
                None,
                false,
            ),
            (
                "failed",
                json!({"phase": "Failed", "podIP": "10.0.0.1"}),
                None,
                false,
            ),
            (
                "podIPs only",
                json!({"podIPs": [{"ip": "fd00::1"}]}),
                None,
                true,
            ),
            (
                "terminating, excluded",
                json!({"podIP": "10.0.0.1"}),
                Some(false),
                false,
            ),
            (
                "terminating, included",
                json!({"podIP": "10.0.0.1"}),
                Some(true),
                true,
            ),
        ];
        for (name, status, terminating, want) in cases {
            let mut meta = json!({"name": "p"});
            if terminating.is_some() {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            let p = pod(json!({"metadata": meta, "status": status}));
            assert_eq!(
                should_be_in_endpoints(&p, terminating.unwrap_or(true)),
                want,
                "{name}"
            );
        }
        let sel: BTreeMap<String, String> = [("app".to_string(), "a".to_string())].into();
        let labels: BTreeMap<String, String> =
            [("app".into(), "a".into()), ("x".into(), "y".into())].into();
        assert!(selector_matches(&sel, Some(&labels)));
        assert!(
            !selector_matches(&BTreeMap::new(), Some(&labels)),
            "empty selector selects nothing"
        );
        assert!(!selector_matches(&sel, None));
    }
}
