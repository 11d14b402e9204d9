//! The horizontal Pod autoscaler against the reference control plane, differentially: the same
//! scenario runs once with kube-controller-manager and once with our `controller-manager`, both
//! with `--controllers horizontalpodautoscaling` and a 1 s `--horizontal-pod-autoscaler-sync-period`,
//! each on its own API server with its own scripted metrics source (a `metrics.k8s.io/v1beta1`
//! server, registered through the aggregation layer: see
//! `controlplane::metrics_server`). No workload controller, scheduler or kubelet
//! runs: the test writes the Deployments and their Pods (Running, with a start time long past,
//! Ready or not) and plays the Deployment controller where a step needs more Pods. Each step
//! waits until the autoscaler's status shows the decision upstream's algorithm makes (desired
//! and current replicas, the CPU utilisation, the conditions' statuses and reasons), then
//! records the whole status (conditions with their messages, currentMetrics) and the target's
//! `/scale`; at the end each autoscaler's Events (type, reason, message). Both records must be
//! equal, and the waits pin the decisions themselves, so both must also be right.
//!
//! The steps (target 50 % of a 100m CPU request):
//! - `web`: 2 Pods at 100 % scale to 4 (SuccessfulRescale); 4 Pods at 52 % stay (within the 10 %
//!   tolerance); at 20 % the scale-down is held by the 300 s stabilisation window
//!   (ScaleDownStabilized), and goes to 2 once the window is set to 0;
//! - `miss`: one of 2 Pods has no sample and the other uses 10 %: the missing one counts as
//!   100 % of its request on a scale-down, which turns the direction round, so no change;
//! - `slow`: 2 Ready Pods at 60 % and one never Ready: the unready one counts as 0 % on a
//!   scale-up, which turns the direction round, so no change;
//! - `burst`: 2 Pods at 200 % with a `behavior` scale-up policy of 1 Pod per 10 minutes: 3, not
//!   8 (ScalingLimited True, ScaleUpLimit);
//! - bounds and rules: maxReplicas caps 8 at 3 (TooManyReplicas), minReplicas lifts 1 to 3
//!   (TooFewReplicas, "Current number of replicas below Spec.MinReplicas"), a target at 0
//!   replicas is left alone (ScalingActive False, ScalingDisabled), a memory AverageValue target,
//!   a Pending Pod (unready), a Percent scale-down policy (ScaleDownLimit), scale-up
//!   `selectPolicy: Disabled` (ScaleUpLimit), a CPU and a ContainerResource memory metric (the
//!   higher proposal wins), two autoscalers of one Deployment (AmbiguousSelector on both; the
//!   names in the message sorted, upstream lists them in a map's order);
//! - bad input: a Pod without the CPU request (FailedGetResourceMetric naming the container and
//!   the Pod); a target Deployment that does not exist, a target kind (Lease) without a scale
//!   subresource and a kind the API server does not serve (AbleToScale False, FailedGetScale); Pods the metrics API has no samples
//!   of (ScalingActive False, FailedGetResourceMetric).
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`). About 20-25 s (both managers at
//! once, the scenario groups side by side).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Cluster, Flavour};
use controlplane::metrics_server::{self, Script};
use controlplane::Options;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::{json, Value};

/// kube-controller-manager's name of the controller; ours takes it too.
const CONTROLLERS: &str = "horizontalpodautoscaling";
const NS: &str = "hpa";
const WAIT: Duration = Duration::from_secs(30);
/// Every Pod starts long before the test (past the CPU initialisation period), at this time.
const STARTED: &str = "2026-01-01T00:00:00Z";

/// What one step records: the autoscaler's status without times, and its target's replicas.
type Record = Vec<(String, Value)>;

struct World {
    cluster: Cluster,
    client: Client,
    script: Script,
    /// Every step's record (the scenario groups run at once; each key is unique).
    record: std::sync::Mutex<Record>,
}

/// The decision a step waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Want {
    /// [`ANY`]: whatever the timing made it, and so ScalingLimited (both left out of the
    /// record).
    desired: i32,
    current: i32,
    /// The CPU's averageUtilization in currentMetrics (`None`: no metric status).
    utilization: Option<i32>,
    able: (&'static str, &'static str),
    /// ScalingActive (`None`: no such condition).
    active: Option<(&'static str, &'static str)>,
    /// ScalingLimited (`None`: no such condition).
    limited: Option<(&'static str, &'static str)>,
}

/// A desired count that depends on which syncs happened first.
const ANY: i32 = -1;
const ACTIVE: Option<(&str, &str)> = Some(("True", "ValidMetricFound"));
const IN_RANGE: Option<(&str, &str)> = Some(("False", "DesiredWithinRange"));
const SAME: (&str, &str) = ("True", "ReadyForNewScale");

impl World {
    fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        &self,
    ) -> Api<K> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create<K>(&self, v: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        common::cluster::create_in(&self.client, NS, v).await
    }

    async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let poll = Duration::from_millis(100);
        self.cluster
            .eventually_showing(what, WAIT, poll, check)
            .await
    }

    /// A Deployment `app` of `replicas` selecting `app=<app>` (no controller acts on it).
    async fn deployment(&self, app: &str, replicas: i32) {
        self.create::<Deployment>(
            json!({"metadata": {"name": app}, "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": {"cpu": "100m"}}}]}}}}),
        )
        .await;
    }

    /// Pod `name` of `app` requesting 100m CPU, Running since [`STARTED`]; Ready, or never Ready
    /// (its Ready condition False since 10 s after the start, within the initial readiness
    /// delay).
    async fn pod(&self, app: &str, name: &str, ready: bool) {
        self.create::<Pod>(json!({"metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m"}}}]}}))
            .await;
        let status = if ready { "True" } else { "False" };
        let patch = json!({"status": {"phase": "Running", "startTime": STARTED, "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": "2026-01-01T00:00:10Z"}]}});
        self.api::<Pod>()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }

    /// Pod `name` of `app` reports `cpu_milli` (`None`: no sample).
    fn usage(&self, app: &str, name: &str, cpu_milli: Option<u32>) {
        self.script.set(NS, name, &[("app", app)], cpu_milli);
    }

    /// An autoscaler `name` for `target` ((apiVersion, kind, name)): 1 to 10 replicas, CPU at
    /// 50 % of the requests, with `behavior`.
    async fn hpa(&self, name: &str, target: (&str, &str, &str), behavior: Value) {
        self.hpa_with(name, target, json!({"behavior": behavior}))
            .await;
    }

    /// The same with `spec` merged over those defaults.
    async fn hpa_with(&self, name: &str, target: (&str, &str, &str), spec: Value) {
        let mut hpa = json!({"metadata": {"name": name}, "spec": {
            "scaleTargetRef": {"apiVersion": target.0, "kind": target.1, "name": target.2},
            "minReplicas": 1, "maxReplicas": 10,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}}]}});
        json_patch::merge(&mut hpa["spec"], &spec);
        self.create::<HorizontalPodAutoscaler>(hpa).await;
    }

    /// Waits until autoscaler `name` shows `want`, then records its status (and, when its
    /// target is a Deployment, the Deployment's scale) under `step`.
    async fn step(&self, step: &str, name: &str, want: Want, scale: Option<&str>) {
        let api = self.api::<HorizontalPodAutoscaler>();
        let status = self
            .eventually(&format!("{step}: {name} at {want:?}"), || {
                let api = api.clone();
                async move {
                    let hpa = api.get(name).await.map_err(|e| e.to_string())?;
                    let mut status = status_record(&hpa);
                    if matches(&status, &want) {
                        if want.desired == ANY {
                            status["desired"] = Value::Null;
                            if let Some(c) = status["conditions"].as_array_mut() {
                                c.retain(|c| c[0] != "ScalingLimited");
                            }
                        }
                        Ok(status)
                    } else {
                        Err(status.to_string())
                    }
                }
            })
            .await;
        self.record
            .lock()
            .unwrap()
            .push((format!("{step}: {name} status"), status));
        if let Some(d) = scale {
            let replicas = self
                .api::<Deployment>()
                .get_scale(d)
                .await
                .unwrap()
                .spec
                .unwrap()
                .replicas
                .unwrap_or(0);
            assert_eq!(
                replicas, want.current,
                "{:?} {step}: the scale of {d}",
                self.cluster.flavour
            );
            self.record
                .lock()
                .unwrap()
                .push((format!("{step}: {d} scale"), json!(replicas)));
        }
    }

    /// Waits for an Event about `hpa` with `reason` from the autoscaler.
    async fn event(&self, hpa: &str, reason: &str) {
        let events = self.api::<Event>();
        self.eventually(&format!("Event {reason} about {hpa}"), || {
            let events = events.clone();
            async move {
                let set = hpa_events(&events).await?;
                if set
                    .get(hpa)
                    .is_some_and(|s| s.iter().any(|e| e.1 == reason))
                {
                    Ok(())
                } else {
                    Err(format!("{set:?}"))
                }
            }
        })
        .await
    }
}

/// The status as recorded: replicas, currentMetrics and the conditions without their times.
fn status_record(hpa: &HorizontalPodAutoscaler) -> Value {
    let s = hpa.status.clone().unwrap_or_default();
    let conditions: Vec<Value> = s
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            json!([
                c.type_,
                c.status,
                c.reason,
                c.message.as_deref().map(normalise)
            ])
        })
        .collect();
    json!({
        "desired": s.desired_replicas,
        "current": s.current_replicas,
        "currentMetrics": s.current_metrics,
        "conditions": conditions,
    })
}

/// A message with the list in its brackets sorted: upstream names the autoscalers of an
/// ambiguous selector in a map's order (`[hpa/twin-2 hpa/twin-1]`), kpr sorted.
fn normalise(message: &str) -> String {
    let (Some(open), Some(close)) = (message.find('['), message.rfind(']')) else {
        return message.to_string();
    };
    if close < open {
        return message.to_string();
    }
    let mut items: Vec<&str> = message[open + 1..close].split(' ').collect();
    items.sort_unstable();
    format!(
        "{}[{}]{}",
        &message[..open],
        items.join(" "),
        &message[close + 1..]
    )
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<(&'a str, &'a str)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c[0] == type_)
        .map(|c| (c[1].as_str().unwrap_or(""), c[2].as_str().unwrap_or("")))
}

fn matches(status: &Value, want: &Want) -> bool {
    let utilization = status["currentMetrics"]
        .as_array()
        .and_then(|m| m.first())
        .and_then(|m| m["resource"]["current"]["averageUtilization"].as_i64())
        .map(|u| u as i32);
    // A zero is left out of the status.
    let replicas = |k: &str| status[k].as_i64().unwrap_or(0);
    (want.desired == ANY || replicas("desired") == i64::from(want.desired))
        && replicas("current") == i64::from(want.current)
        && utilization == want.utilization
        && condition(status, "AbleToScale") == Some(want.able)
        && condition(status, "ScalingActive") == want.active
        && (want.desired == ANY || condition(status, "ScalingLimited") == want.limited)
}

/// The autoscaler's Events by autoscaler: (type, reason, message), each once.
async fn hpa_events(
    events: &Api<Event>,
) -> Result<BTreeMap<String, BTreeSet<(String, String, String)>>, String> {
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut out: BTreeMap<String, BTreeSet<_>> = BTreeMap::new();
    for e in list.items {
        if e.source.as_ref().and_then(|s| s.component.as_deref())
            != Some("horizontal-pod-autoscaler")
            || e.involved_object.kind.as_deref() != Some("HorizontalPodAutoscaler")
        {
            continue;
        }
        out.entry(e.involved_object.name.unwrap_or_default())
            .or_default()
            .insert((
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                normalise(&e.message.unwrap_or_default()),
            ));
    }
    Ok(out)
}

/// Scale up, tolerance, stabilised scale-down.
async fn up_and_down(w: &World) {
    w.deployment("web", 2).await;
    for p in ["web-a", "web-b"] {
        w.pod("web", p, true).await;
        w.usage("web", p, Some(100));
    }
    w.hpa(
        "web",
        ("apps/v1", "Deployment", "web"),
        json!({"scaleDown": {"stabilizationWindowSeconds": 300}}),
    )
    .await;
    // 100 % against 50 %: twice the 2 Pods. The next syncs see 4 replicas of which 2 Pods
    // report, still twice the target over 2 Pods: 4 again.
    let steady = |utilization| Want {
        desired: 4,
        current: 4,
        utilization: Some(utilization),
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };
    w.step("scale up", "web", steady(100), Some("web")).await;
    w.event("web", "SuccessfulRescale").await;

    // The Deployment controller's part: two more Pods. 52 % is within the tolerance.
    for p in ["web-a", "web-b", "web-c", "web-d"] {
        w.usage("web", p, Some(52));
    }
    for p in ["web-c", "web-d"] {
        w.pod("web", p, true).await;
    }
    w.step("tolerance", "web", steady(52), Some("web")).await;

    // 20 %: 2 would do, but the 4 recommended in the last 300 s hold.
    for p in ["web-a", "web-b", "web-c", "web-d"] {
        w.usage("web", p, Some(20));
    }
    let held = Want {
        able: ("True", "ScaleDownStabilized"),
        ..steady(20)
    };
    w.step("stabilised", "web", held, Some("web")).await;

    // No window: down to 2 (and 4 Pods at 20 % keep recommending 2).
    w.api::<HorizontalPodAutoscaler>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}}),
            ),
        )
        .await
        .unwrap();
    let down = Want {
        desired: 2,
        current: 2,
        ..steady(20)
    };
    w.step("scale down", "web", down, Some("web")).await;
}

/// Missing samples and unready Pods turn a decision round.
async fn missing_and_unready(w: &World) {
    let window0 = json!({"scaleDown": {"stabilizationWindowSeconds": 0}});
    let stay = |utilization| Want {
        desired: 2,
        current: 2,
        utilization: Some(utilization),
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };

    w.deployment("miss", 2).await;
    w.pod("miss", "miss-a", true).await;
    w.pod("miss", "miss-b", true).await;
    w.usage("miss", "miss-a", Some(10));
    w.usage("miss", "miss-b", None);
    w.hpa("miss", ("apps/v1", "Deployment", "miss"), window0.clone())
        .await;
    // 10 % alone would mean 1; miss-b counted at 100 % makes 55 %: above target, no scale-down.
    w.step("missing metric", "miss", stay(10), Some("miss"))
        .await;

    w.deployment("slow", 2).await;
    for p in ["slow-a", "slow-b"] {
        w.pod("slow", p, true).await;
        w.usage("slow", p, Some(60));
    }
    w.pod("slow", "slow-c", false).await;
    w.usage("slow", "slow-c", Some(0));
    w.hpa("slow", ("apps/v1", "Deployment", "slow"), window0)
        .await;
    // 60 % on the Ready Pods would mean 3; slow-c counted at 0 % makes 40 %: no scale-up.
    w.step("unready pod", "slow", stay(60), Some("slow")).await;
}

/// A `behavior` scale-up policy limits the step.
async fn limited(w: &World) {
    w.deployment("burst", 2).await;
    for p in ["burst-a", "burst-b"] {
        w.pod("burst", p, true).await;
        w.usage("burst", p, Some(200));
    }
    w.hpa(
        "burst",
        ("apps/v1", "Deployment", "burst"),
        json!({"scaleUp": {"stabilizationWindowSeconds": 0,
                           "policies": [{"type": "Pods", "value": 1, "periodSeconds": 600}]},
               "scaleDown": {"stabilizationWindowSeconds": 0}}),
    )
    .await;
    // 8 recommended, 1 Pod per 10 minutes allowed: 3, and 3 it stays.
    let want = Want {
        desired: 3,
        current: 3,
        utilization: Some(200),
        able: SAME,
        active: ACTIVE,
        limited: Some(("True", "ScaleUpLimit")),
    };
    w.step("scale-up policy", "burst", want, Some("burst"))
        .await;
    w.event("burst", "SuccessfulRescale").await;
}

/// The replica bounds, a target at zero, an average memory value, two autoscalers of one target.
async fn limits(w: &World) {
    let window0 = json!({"scaleDown": {"stabilizationWindowSeconds": 0}});
    // 8 recommended, 3 at most.
    w.deployment("cap", 2).await;
    for p in ["cap-a", "cap-b"] {
        w.pod("cap", p, true).await;
        w.usage("cap", p, Some(200));
    }
    w.hpa_with(
        "cap",
        ("apps/v1", "Deployment", "cap"),
        json!({"maxReplicas": 3, "behavior": window0}),
    )
    .await;
    let want = Want {
        desired: 3,
        current: 3,
        utilization: Some(200),
        able: SAME,
        active: ACTIVE,
        limited: Some(("True", "TooManyReplicas")),
    };
    w.step("maxReplicas", "cap", want, Some("cap")).await;

    // 1 recommended, 3 at least.
    w.deployment("floor", 2).await;
    for p in ["floor-a", "floor-b"] {
        w.pod("floor", p, true).await;
        w.usage("floor", p, Some(10));
    }
    w.hpa_with(
        "floor",
        ("apps/v1", "Deployment", "floor"),
        json!({"minReplicas": 3, "behavior": window0}),
    )
    .await;
    let want = Want {
        desired: 3,
        current: 3,
        utilization: Some(10),
        able: SAME,
        active: ACTIVE,
        limited: Some(("True", "TooFewReplicas")),
    };
    w.step("minReplicas", "floor", want, Some("floor")).await;

    // A target scaled to zero by hand: the autoscaler keeps off.
    w.deployment("zero", 0).await;
    w.hpa("zero", ("apps/v1", "Deployment", "zero"), window0.clone())
        .await;
    let want = Want {
        desired: 0,
        current: 0,
        utilization: None,
        able: ("True", "SucceededGetScale"),
        active: Some(("False", "ScalingDisabled")),
        limited: None,
    };
    w.step("target at zero", "zero", want, Some("zero")).await;

    // 10Mi per Pod against an average of 4Mi: ceil(2.5 × 2) = 5.
    w.deployment("mem", 2).await;
    for p in ["mem-a", "mem-b"] {
        w.pod("mem", p, true).await;
        w.usage("mem", p, Some(30));
    }
    w.hpa_with(
        "mem",
        ("apps/v1", "Deployment", "mem"),
        json!({"metrics": [{"type": "Resource", "resource": {"name": "memory",
                "target": {"type": "AverageValue", "averageValue": "4Mi"}}}],
               "behavior": window0}),
    )
    .await;
    let want = Want {
        desired: 5,
        current: 5,
        utilization: None,
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };
    w.step("memory average", "mem", want, Some("mem")).await;

    // Two autoscalers of one Deployment: neither acts.
    w.deployment("twin", 1).await;
    w.pod("twin", "twin-a", true).await;
    w.usage("twin", "twin-a", Some(50));
    // The first one's first sync may come before the second exists (and scale by itself, and
    // write ScalingLimited, which stays).
    let ambiguous = Want {
        desired: ANY,
        current: 1,
        utilization: None,
        able: ("True", "SucceededGetScale"),
        active: Some(("False", "AmbiguousSelector")),
        limited: None,
    };
    for h in ["twin-1", "twin-2"] {
        w.hpa(h, ("apps/v1", "Deployment", "twin"), window0.clone())
            .await;
    }
    for h in ["twin-1", "twin-2"] {
        w.step("ambiguous selector", h, ambiguous, Some("twin"))
            .await;
        w.event(h, "AmbiguousSelector").await;
    }
}

/// More of the rules: Pending Pods, scale-down and disabled scale-up policies, two metrics (one
/// of a container), a Pod without the request.
async fn more_rules(w: &World) {
    let window0 = json!({"scaleDown": {"stabilizationWindowSeconds": 0}});
    // A Pending Pod counts as unready: 0 % on a scale-up, which turns it round.
    w.deployment("pend", 2).await;
    for p in ["pend-a", "pend-b"] {
        w.pod("pend", p, true).await;
        w.usage("pend", p, Some(60));
    }
    w.create::<Pod>(
        json!({"metadata": {"name": "pend-c", "labels": {"app": "pend"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}}}]}}),
    )
    .await;
    w.usage("pend", "pend-c", Some(100));
    w.hpa("pend", ("apps/v1", "Deployment", "pend"), window0.clone())
        .await;
    let stay = Want {
        desired: 2,
        current: 2,
        utilization: Some(60),
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };
    w.step("pending pod", "pend", stay, Some("pend")).await;

    // 1 recommended, half the replicas per 10 minutes may go: 2.
    w.deployment("trim", 4).await;
    for p in ["trim-a", "trim-b", "trim-c", "trim-d"] {
        w.pod("trim", p, true).await;
        w.usage("trim", p, Some(10));
    }
    w.hpa(
        "trim",
        ("apps/v1", "Deployment", "trim"),
        json!({"scaleDown": {"stabilizationWindowSeconds": 0,
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 600}]}}),
    )
    .await;
    let want = Want {
        desired: 2,
        current: 2,
        utilization: Some(10),
        able: SAME,
        active: ACTIVE,
        limited: Some(("True", "ScaleDownLimit")),
    };
    w.step("scale-down policy", "trim", want, Some("trim"))
        .await;

    // Scale-up disabled: 8 recommended, 2 kept.
    w.deployment("frozen", 2).await;
    for p in ["frozen-a", "frozen-b"] {
        w.pod("frozen", p, true).await;
        w.usage("frozen", p, Some(200));
    }
    w.hpa(
        "frozen",
        ("apps/v1", "Deployment", "frozen"),
        json!({"scaleUp": {"selectPolicy": "Disabled"},
               "scaleDown": {"stabilizationWindowSeconds": 0}}),
    )
    .await;
    let want = Want {
        desired: 2,
        current: 2,
        utilization: Some(200),
        able: SAME,
        active: ACTIVE,
        limited: Some(("True", "ScaleUpLimit")),
    };
    w.step("scale-up disabled", "frozen", want, Some("frozen"))
        .await;

    // CPU at 40 % of 50 % wants 2; container c's 10Mi against an average of 8Mi wants 3.
    w.deployment("multi", 2).await;
    for p in ["multi-a", "multi-b"] {
        w.pod("multi", p, true).await;
        w.usage("multi", p, Some(40));
    }
    w.hpa_with(
        "multi",
        ("apps/v1", "Deployment", "multi"),
        json!({"metrics": [
            {"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "ContainerResource", "containerResource": {"name": "memory",
                "container": "c", "target": {"type": "AverageValue", "averageValue": "8Mi"}}}],
            "behavior": window0}),
    )
    .await;
    let want = Want {
        desired: 3,
        current: 3,
        utilization: Some(40),
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };
    w.step("two metrics", "multi", want, Some("multi")).await;

    // A Pod without a CPU request: no utilisation can be computed.
    w.deployment("noreq", 1).await;
    w.create::<Pod>(
        json!({"metadata": {"name": "noreq-a", "labels": {"app": "noreq"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await;
    w.api::<Pod>()
        .patch_status(
            "noreq-a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"phase": "Running", "startTime": STARTED,
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-01-01T00:00:10Z"}]}})),
        )
        .await
        .unwrap();
    w.usage("noreq", "noreq-a", Some(50));
    w.hpa("noreq", ("apps/v1", "Deployment", "noreq"), window0)
        .await;
    let want = Want {
        desired: 0,
        current: 1,
        utilization: None,
        able: ("True", "SucceededGetScale"),
        active: Some(("False", "FailedGetResourceMetric")),
        limited: None,
    };
    w.step("no request", "noreq", want, Some("noreq")).await;
}

/// Targets that do not exist or cannot scale, and no metrics at all.
/// A target named in a version of its group the API server no longer serves (upstream's e2e
/// specs write `apps/v1beta2`): the kind is found in a version that is served.
async fn unserved_version(w: &World) {
    w.deployment("old", 2).await;
    for p in ["old-a", "old-b"] {
        w.pod("old", p, true).await;
        w.usage("old", p, Some(100));
    }
    w.hpa("old", ("apps/v1beta2", "Deployment", "old"), json!(null))
        .await;
    let want = Want {
        desired: 4,
        current: 4,
        utilization: Some(100),
        able: SAME,
        active: ACTIVE,
        limited: IN_RANGE,
    };
    w.step("unserved version", "old", want, Some("old")).await;
    w.event("old", "SuccessfulRescale").await;
}

async fn bad_input(w: &World) {
    let no_scale = Want {
        desired: 0,
        current: 0,
        utilization: None,
        able: ("False", "FailedGetScale"),
        active: None,
        limited: None,
    };
    w.hpa("ghost", ("apps/v1", "Deployment", "ghost"), json!(null))
        .await;
    w.step("missing target", "ghost", no_scale, None).await;
    w.event("ghost", "FailedGetScale").await;

    // The API server takes no core-group target ("apiVersion must specify API group"): a
    // Lease exists but has no scale subresource.
    w.create::<Lease>(json!({"metadata": {"name": "lock"}}))
        .await;
    w.hpa(
        "lock",
        ("coordination.k8s.io/v1", "Lease", "lock"),
        json!(null),
    )
    .await;
    w.step("not scalable", "lock", no_scale, None).await;
    w.event("lock", "FailedGetScale").await;

    // A kind the API server does not serve at all.
    w.hpa("widget", ("example.com/v1", "Widget", "w"), json!(null))
        .await;
    w.step("unknown kind", "widget", no_scale, None).await;
    w.event("widget", "FailedGetScale").await;

    w.deployment("dry", 2).await;
    for p in ["dry-a", "dry-b"] {
        w.pod("dry", p, true).await;
    }
    w.hpa("dry", ("apps/v1", "Deployment", "dry"), json!(null))
        .await;
    let want = Want {
        desired: 0,
        current: 2,
        utilization: None,
        able: ("True", "SucceededGetScale"),
        active: Some(("False", "FailedGetResourceMetric")),
        limited: None,
    };
    w.step("no metrics", "dry", want, Some("dry")).await;
    w.event("dry", "FailedGetResourceMetric").await;
    w.event("dry", "FailedComputeMetricsReplicas").await;
}

async fn scenario(flavour: Flavour) -> Record {
    let opts = Options::minimal(controlplane::run_dir(&format!("hpa-{}", flavour.tag())));
    let flags = vec!["--horizontal-pod-autoscaler-sync-period=1s".to_string()];
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start_with_flags(flavour, CONTROLLERS, opts, flags, |_| Ok(()))
    })
    .expect("starting the control plane");
    let (cert, key) = {
        let cp = cluster.cp();
        let c = cp
            .pki
            .server("scripted-metrics", &["localhost"])
            .expect("a serving certificate");
        (c.cert, c.key)
    };
    let (port, script) = metrics_server::start(&cert, &key)
        .await
        .expect("starting the scripted metrics server");
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    metrics_server::register(&client, port, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{flavour:?}: {e:#}"));
    let w = World {
        cluster,
        client,
        script,
        record: Default::default(),
    };
    Api::<Namespace>::all(w.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .unwrap();
    // No serviceaccount controller runs: the ServiceAccount admission wants the default one.
    w.create::<ServiceAccount>(json!({"metadata": {"name": "default"}}))
        .await;

    // Independent autoscalers, targets and Pods: the groups run side by side.
    tokio::join!(
        up_and_down(&w),
        missing_and_unready(&w),
        limited(&w),
        limits(&w),
        more_rules(&w),
        bad_input(&w),
        unserved_version(&w),
    );

    let events = hpa_events(&w.api::<Event>()).await.unwrap();
    let mut by_reason: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (hpa, set) in events {
        for (type_, reason, message) in set {
            by_reason
                .entry(format!("events of {hpa}: {reason}"))
                .or_default()
                .push((type_, message));
        }
    }
    w.cluster.check_alive().unwrap();
    let mut record = w.record.into_inner().unwrap();
    record.extend(by_reason.into_iter().map(|(k, v)| (k, json!(v))));
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hpa_decisions_match_kube_controller_manager() {
    let upstream = tokio::spawn(scenario(Flavour::Upstream));
    let kpr = tokio::spawn(scenario(Flavour::Kpr));
    let (upstream, kpr) = (upstream.await, kpr.await);
    let (upstream, kpr) = match (upstream, kpr) {
        (Ok(u), Ok(k)) => (u, k),
        (Err(e), _) | (_, Err(e)) => std::panic::resume_unwind(e.into_panic()),
    };
    let mut differences = Vec::new();
    let upstream_map: BTreeMap<_, _> = upstream.iter().cloned().collect();
    let kpr_map: BTreeMap<_, _> = kpr.iter().cloned().collect();
    for key in upstream_map
        .keys()
        .chain(kpr_map.keys())
        .collect::<BTreeSet<_>>()
    {
        let (u, k) = (upstream_map.get(key), kpr_map.get(key));
        if u != k {
            differences.push(format!(
                "{key}:\n  kube-controller-manager: {}\n  kpr:                     {}",
                u.map_or("(none)".into(), Value::to_string),
                k.map_or("(none)".into(), Value::to_string)
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "kpr's autoscaler differs from kube-controller-manager's:\n{}",
        differences.join("\n")
    );
}
